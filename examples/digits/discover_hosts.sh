#!/bin/sh
# Host discovery in horovodrun's format: one "host:slots" per line. This one prints a hosts
# file, so adding or removing a line scales the job.
exec cat "${HOSTS_FILE:-$(dirname "$0")/hosts.txt}"
