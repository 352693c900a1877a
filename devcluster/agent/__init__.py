"""The node agent: plays the kubelet for the cluster's nodes and runs pods as processes."""
