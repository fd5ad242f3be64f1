"""The learner loop's policies toward Redis and the run: what it publishes for servers and
environments (``published``), its pace and stalls (``progress``), the environment's reward and
the run's target (``target``), pushes to restarted servers (``healing``) and the final
evaluation (``final_eval``)."""
