"""A worker's link to the rendezvous service: its HTTP client, the job's notices, what it
reports (results, progress, commits) and its heartbeat with the probes of its peers."""
