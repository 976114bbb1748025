"""The machine: hardware profiles (recipes as data, detection of the device we are on) and the card table of peak
FLOP/s that MFU divides by. Imports only config/ and the shared helpers."""
