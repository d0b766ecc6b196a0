"""gpuwarden controller: stops a workload from killing GPU nodes one after another (incident 4).

A Deployment (leader-elected on a coordination.k8s.io/v1 Lease) that watches Nodes, Pods and
gpuwarden Events, and detects two things a node-level agent cannot see:

- a **cascade**: pods of one workload were on two or more GPU nodes that failed one after the other
  (NotReady, or the agent's GPUUnchargedMemory / GPUDriver findings), the pod hopping to the next node
  after each failure; the second failed node is the signal;
- a **storm**: many GPU nodes failing within a short window;
- a **fence storm**: many GPU nodes fenced by their agents for the same code (one bad driver or one
  fleet-wide Xid, not many bad nodes): the breaker opens, and closes again once it passed.

It answers (opt-in, dry-run by default) by quarantining the workload (scale to zero / suspend, with
the undo recorded in an annotation; `gpuwarden release` restores it), optionally tainting the GPU
pool, and in a storm by opening the agents' circuit breaker. See docs/controller.md.

Modules: `model` (reading Nodes, Pods, owners; pure), `detect` (history of node failures and pod
placements, the cascade and storm rules; pure), `fencing` (the fence storm; pure), `quarantine` (annotation format and the patches
for quarantine and release; pure), `actions` (the API writes), `lease` (leader election),
`kube` (REST client additions and informers), `loop` (the controller), `fleet` (`gpuwarden fleet`),
`config` (options), `dra` and `dra_watch` (`--dra-driver`: orphaned DeviceTaintRules, slices of dead
nodes; docs/dra.md "The controller").
"""
