"""The sending side of the weight broadcast: the seam the training loop pushes through
(``base``), the broadcast to every live server (``broadcast``) and the healing of servers that
restarted behind (``healing``)."""
