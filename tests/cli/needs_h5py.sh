# Sourced by the CLI tests that read logs: sets $py to Debian's python3, or
# exits 77 (CTest: Skipped) when it lacks h5py and numpy.
py=/usr/bin/python3
if ! "$py" -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIP: $py with h5py and numpy is needed to read the logs (apt install python3-h5py)"
  exit 77
fi
