"""The live dashboard every rollout server serves: the run at a glance and a rollout browser.

``state`` reads what the page's panels show, ``recent`` and ``render`` what its rollout browser
shows, ``protocol`` holds the wire models; ``static/`` is the page itself (HTML, CSS, vanilla
JS; package data, no CDN). The routes: ``gspo_rl.server.api.routes.dashboard``. docs/dashboard.md.
"""
