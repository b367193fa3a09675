// The one source of the hpctrain::datasets CMake target, compiled into each program that links it: its include
// registers the Parquet and Arrow formats with text/rows.hpp before main.
#include <hpctrain/datasets/datasets.hpp>
