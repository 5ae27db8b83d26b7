#include "backend/cpu/vec.h"

#include <bit>

namespace deltaserve::vec {

namespace {
constexpr int kLanes = 16;
inline float bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
inline float reduce(const float* acc) {
  float s = 0.f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}
}  // namespace

DS_VEC_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

DS_VEC_CLONES float dot_bf16(const float* a, const uint16_t* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * bf16(x[i + j]);
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * bf16(x[i]);
  return s;
}

DS_VEC_CLONES void axpy_bf16(float* y, float alpha, const uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * bf16(x[i]);
}

DS_VEC_CLONES float sum_squares(const float* a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * a[i + j];
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * a[i];
  return s;
}

DS_VEC_CLONES void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

DS_VEC_CLONES void scale(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

DS_VEC_CLONES float scale_dot(float* y, float s, const float* k, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      y[i + j] *= s;
      acc[j] += y[i + j] * k[i + j];
    }
  float r = reduce(acc);
  for (; i < n; ++i) {
    y[i] *= s;
    r += y[i] * k[i];
  }
  return r;
}

DS_VEC_CLONES float axpy_dot(float* y, float alpha, const float* x, const float* q, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      y[i + j] += alpha * x[i + j];
      acc[j] += y[i + j] * q[i + j];
    }
  float r = reduce(acc);
  for (; i < n; ++i) {
    y[i] += alpha * x[i];
    r += y[i] * q[i];
  }
  return r;
}

}  // namespace deltaserve::vec
