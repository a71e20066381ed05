"""DMP DV700 target: generated C++ network sources, packed weights, layer-table simulator."""
