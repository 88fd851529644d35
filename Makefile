# The two commands of the README, and the fast inner loop.
.PHONY: up up-two-domains up-workers up-nodes test test-fast
up:
	scripts/up.sh
# Two reTHINK domains, each with its Synapse and node, federating over loopback.
up-two-domains:
	scripts/up.sh --two-domains
# Synapse in worker mode (event persisters, the appservice push) on the local PostgreSQL and Redis.
up-workers:
	scripts/up.sh --workers
# One domain on two node processes sharing the stub port, on the local PostgreSQL.
up-nodes:
	scripts/up.sh --nodes 2
test:
	scripts/test.sh
# Lint, types, layering, the stub's Node tests and the unit tests (no Synapse): seconds.
test-fast:
	scripts/test.sh --fast
