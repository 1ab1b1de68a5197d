"""Reports and exporters: status for other accounts, doctor, metrics, node labels,
Slurm and Kubernetes, device discovery, the progress of a running copy or warm."""
