# The two commands of the README.
.PHONY: up test
up:
	scripts/up.sh
test:
	scripts/test.sh
