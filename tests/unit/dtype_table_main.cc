// Prints common/dtype.cc's table, a row per dtype in enum order: the proto's name, its value,
// the element size, numpy's name and the Open Inference Protocol's datatype, separated by
// spaces. dtype_table_test.py holds the Python client's mirror of the table against it.
#include <iostream>

#include "common/dtype.h"

int main() {
  for (opserve::DType d : opserve::kAllDTypes) {
    std::cout << opserve::DTypeName(d) << " " << static_cast<int>(d) << " "
              << opserve::ElementSize(d) << " " << opserve::NumpyName(d) << " "
              << opserve::OipName(d) << "\n";
  }
  return 0;
}
