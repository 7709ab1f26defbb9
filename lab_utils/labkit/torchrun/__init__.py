"""Start N torchrun agents on this machine as if they were N nodes, stream their output, leave nothing behind.

    result = run_nodes("train.py", "--steps", "8", nnodes=2, nproc_per_node=1, rdzv="c10d", timeout=60)

Each "node" is a real ``torchrun`` agent (``python -m torch.distributed.run``) on 127.0.0.1, started exactly
as you would start one per machine (``agent_command`` returns that command line, for a slide or a terminal).
That 127.0.0.1 is the ranks' own network wherever the launcher's zygote has one (``lab_utils.netns``): the agents,
their workers and the run's store join it, so no other user of the machine reaches them; elsewhere, the machine's.
What this module adds around torchrun, and why:
- Output of every agent and its workers streams into the cell as ``[node i] ...``, printed from the calling
  thread (ipykernel routes output from background threads unreliably).
- Nothing survives. torchrun starts each worker in its *own session*, so killing an agent's process group
  does not reach its workers, and a worker of a timed-out cell keeps running (ARCHITECTURE.md §7). Every
  agent gets a marker ``DTLABS_RUN_ID`` in its environment, which its workers inherit; on success, error,
  timeout or ``KeyboardInterrupt`` we SIGKILL each agent's process group, every descendant we saw, and every
  process of ours that carries the marker (found with psutil). Agents also get ``PR_SET_PDEATHSIG=SIGTERM``
  (Linux) so a dying kernel takes them along, and torchrun stops its workers on SIGTERM.
- Restarts work with gloo: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives each restart attempt a fresh store;
  with the agent's shared store, restarted gloo workers can read stale peer addresses and hang for the
  30-minute default (pytorch#135712). That is c10d's rendezvous: a static one keeps its one store for every
  attempt (and never has the other nodes restart), so ``run_nodes`` refuses ``max_restarts`` without c10d.
- No agent's exit strands another. The agent that hosts the rendezvous store must outlive every agent that
  still talks to it (the exit barrier, the rendezvous shutdown); on a loaded machine a host that finishes
  first fails the other agent with "Failed to recv ... Did the remote server shutdown or crash?". So with
  c10d the run has a rendezvous store of its own (a ``TCPStore`` on port 0, alive until every agent is gone,
  which the launcher's zygote hosts for this process in the ranks' network) and every agent joins it without
  hosting (``--rdzv-conf=is_host=false``). A static rendezvous always
  has node 0 host the store, so node 0's agent waits, after torchrun is done, until this process has seen every
  other agent exit (``DTLABS_AGENT_STORE``: where it asks; capped at ``HOST_WAIT_S``).
- Elastic runs (Lab 09): ``min_nodes`` makes the agents' ``--nnodes=MIN:MAX``, and ``events`` lets the job's own
  output drive membership, as a cluster would: a line containing a marker mapped to ``"leave"`` kills the node that
  printed it (its agent and workers at once, like a machine that fails), one mapped to ``"join"`` starts one more
  agent. The job decides *when* (a worker prints the marker at a chosen step and waits), so where a node leaves or
  joins is deterministic however loaded the machine is; each marker fires once. A node that left is expected to
  have exited non-zero: it neither fails the run nor stops the others.
- Agents and workers start warm: the agents fork from a server in this process that imported torch once, and each
  has torchrun fork its ``python -u SCRIPT`` workers from another (``warmstart``; a CPU-second per agent, worker and
  restart); they are otherwise what a cold start makes. c.DTLabs.warm_torchrun off starts them cold.
- Ports: c10d's store listens on a port the OS hands out while it binds, so nobody can take it first. The static
  master port is picked free on 127.0.0.1; if another process takes it first, the whole run is retried on a new
  port. torch reports that (EADDRINUSE) only after a minute of retries, so the harness also looks, once a second
  until node 0 listens, for another process listening on the port.

| module  | its one job                                                                           |
|---------|---------------------------------------------------------------------------------------|
| nodes   | ``run_nodes``: the agents started, their output streamed, ports retried, events fired |
| reaping | nothing survives: agents, workers and marked processes killed; the run's port watched |
| store   | the run's rendezvous store, where its agents reach it: the ranks' network, the first host, or loopback |
| hosts   | hosts of their own on one machine: namespaces with an address, a name and an /etc/hosts each |
| preflight | ``dtlabs doctor --nodes``: names, the interface and the port a multi-node job needs, checked first |
| agent   | what each agent process runs: torchrun's main, dying with the harness, node 0 staying |
| warmstart | agents and workers forked from warm servers in the harness's process instead of started cold |
"""
from __future__ import annotations

from lab_utils.labkit.torchrun.nodes import (TorchrunError, TorchrunResult, TorchrunTimeout, agent_command,
                                             first_failure, run_nodes, write_script)
from lab_utils.labkit.torchrun.reaping import processes_of

__all__ = ["run_nodes", "agent_command", "write_script", "processes_of", "first_failure", "TorchrunResult",
           "TorchrunError", "TorchrunTimeout"]
