"""Which sync policy for a cluster, by prediction: a cluster model drives the simulator at the
target scale, and a convergence model fitted from live runs turns what the simulation says
about each policy (throughput, staleness, samples per applied update) into time to target."""
