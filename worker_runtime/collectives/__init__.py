"""The collectives of the Horovod API on each round's group: their issuing, matching across
ranks (negotiation), handles, process sets, and the operations by family."""
