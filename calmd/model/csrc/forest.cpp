// The learned rankers' tree ensembles (calmd/suggest/forest.py), walked for a keystroke's rows:
// each row through every tree, from its root to a leaf, the leaves' values summed. The arrays are
// the forest's as calmd/suggest/forest.py checked them when it read the file: every split names a
// feature below n_cols and children that are later nodes, so each walk ends inside the arrays.
#include <cstdint>

extern "C" {

void calm_forest_f64(const double* rows, int64_t n_rows, int64_t n_cols, const int64_t* feature,
                     const double* threshold, const int64_t* left, const int64_t* right,
                     const double* value, const int64_t* roots, int64_t n_trees, double* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const double* x = rows + r * n_cols;
    double sum = 0.0;
    for (int64_t t = 0; t < n_trees; ++t) {
      int64_t node = roots[t];
      while (feature[node] >= 0) node = x[feature[node]] <= threshold[node] ? left[node] : right[node];
      sum += value[node];
    }
    out[r] = sum;
  }
}

}  // extern "C"
