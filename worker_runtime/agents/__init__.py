"""The long-lived supervisors a pod runs around a training script: one process per slot, the
restart-mode agent (and the script it runs), the health check before a pod joins. They import
no torch themselves."""
