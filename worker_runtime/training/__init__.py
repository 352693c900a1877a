"""What a training step uses: ``DistributedOptimizer``, the gradient reducer and its buckets,
a rank's weight in the average, ``SyncBatchNorm``."""
