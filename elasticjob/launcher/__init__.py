"""``elasticjob-run``: a horovodrun-style local launcher for elastic jobs."""
