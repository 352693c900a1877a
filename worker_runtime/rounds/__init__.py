"""A worker's rounds: joining each (the one round protocol of every worker-side process), its
group's formation and process group, the agreement on host updates, the slot's place, device
and network interface."""
