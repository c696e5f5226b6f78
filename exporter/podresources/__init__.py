"""The kubelet's pod-resources API (v1): its gRPC stubs, a client on the kubelet's unix socket, and the mapper that
names the pod and container holding each GPU."""
