"""Running the whole stack on one machine: a local Synapse and the node."""
