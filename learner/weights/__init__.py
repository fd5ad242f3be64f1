"""The sending side of the weight broadcast: the seam the training loop pushes through
(``base``) and the broadcast to every live server (``broadcast``). Re-pushing to servers that
restarted behind is the loop's (``gspo_rl.learner.runtime.healing``)."""
