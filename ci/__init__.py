"""The papermill lab chain (ci.run), its profiles (ci/profiles/*.yaml) and the environment set-up (bootstrap.sh)."""
