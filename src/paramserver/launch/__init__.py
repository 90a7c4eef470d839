"""Starting a job's processes: on this host, as Ray actors, across network namespaces."""
