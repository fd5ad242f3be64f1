"""Multi-turn episodes in Redis: opened as a group, grown one model turn at a time, closed by
their reward. ``store`` holds the operations, ``scripts`` the Lua they run."""
