"""Where the ranks meet and the machines keep in step: the rendezvous, machine 0's gate and
table, the job's secret, the group of launchers, network helpers."""
