"""A group's life in Redis, server side: opened, rollouts recorded, rewarded, then published
to the ready stream exactly once (with its advantages) or dropped; expired at its deadline.
``store`` holds the operations, ``scripts``, ``rewards`` and ``credit`` the Lua they run,
``finish`` the Python side of ending a group, ``types`` the values they take and return."""
