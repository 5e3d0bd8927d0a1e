"""One module per pipeline; each flow reads like its seed's diagram."""
