"""`kubectl gpuwarden`: the operator's view from a laptop, through the Kubernetes API only.

A kubectl plugin by krew's conventions: one executable, `kubectl-gpuwarden`, on PATH (the
package's console script), so `kubectl gpuwarden fleet|node|check ...` works. `fleet` is
`gpuwarden fleet`; `node` reads what the agent published about one node (NodeConditions and
Events); `check` runs a one-shot check in a short-lived privileged pod pinned to the node.
"""
