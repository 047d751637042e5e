#!/usr/bin/env bash
# Gradescope's setup (the autograder image, once): the tools this handout builds with. Ubuntu image.
set -euo pipefail
apt-get update
apt-get install -y g++ make pkg-config python3 libutf8proc-dev
