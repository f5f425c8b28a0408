"""The Ray cluster itself: the embedded cluster and its supervisor, node discovery, node providers,
Ray's token auth, the nodes' power meters."""
