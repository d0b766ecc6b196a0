"""The Kubernetes layer shared by the agent, the controller, remediation and kubectl: the REST
client (`client`), what its failures mean (`errors`), informers (`informer`), Events (`events`),
the NodeCondition vocabulary (`conditions`) and the components' log lines (`log`). It imports
only the standard library, `parsers` and, lazily, the kubernetes package; nothing above it."""
