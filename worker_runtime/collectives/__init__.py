"""The collectives of the Horovod API on each round's group: their issuing, matching across
ranks (negotiation), handles, process sets, and the operations by family (reduce, gather,
broadcast, scatter, objects), each described once with its forms made from the description."""
