// The CUDA backend's developer overrides from the environment (backend/cuda_option_env.h): each
// value sets its CudaOptions field; a name not in the table or a value outside a knob's set is an
// error naming the variable (and, for a value, what it takes); the process's environment is read
// for our prefixes only. Runs without a GPU (the parsing is host code).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda_option_env.h"

namespace deltaserve {
namespace {

CudaOptions parsed(const EnvVariables& vars) {
  auto o = cuda_options_from(vars);
  EXPECT_TRUE(o.is_ok()) << o.status().message();
  return o.is_ok() ? *o : CudaOptions{};
}

std::string failure(const EnvVariables& vars) {
  auto o = cuda_options_from(vars);
  EXPECT_FALSE(o.is_ok());
  return o.is_ok() ? std::string() : o.status().message();
}

std::vector<std::string> table_names() {
  std::vector<std::string> names;
  std::istringstream in(cuda_option_table());
  for (std::string line; std::getline(in, line);) names.push_back(line.substr(2, line.find('=') - 2));
  return names;
}

TEST(CudaOptionEnv, NoVariablesGiveTheProductionSettings) {
  const CudaOptions d{}, o = parsed({});
  EXPECT_EQ(o.exact_gemm, d.exact_gemm);
  EXPECT_EQ(o.gdn_decode_stage, 1);
  EXPECT_EQ(o.gdn_decode_layout, 0);
  EXPECT_TRUE(o.gdn_chunked && o.gdn_chunked_mma && !o.gdn_thread_per_row);
  EXPECT_EQ(o.flash_wgmma, -1);
  EXPECT_EQ(o.gemm_algo, -1);
}

TEST(CudaOptionEnv, ValuesSetTheirFields) {
  CudaOptions o = parsed({{"DELTASERVE_CUDA_GEMM", "exact"},
                          {"DELTASERVE_CUDA_GDN_STAGE", "2"},
                          {"DELTASERVE_CUDA_GDN_LAYOUT", "44"},
                          {"DELTASERVE_CUDA_GDN_CLUSTER", "8"},
                          {"DELTASERVE_CUDA_PDL", "0"},
                          {"DELTASERVE_CUDA_FLASH_WGMMA", "1"},
                          {"DELTASERVE_CUBLAS_WORKSPACE_MB", "-1"},
                          {"DELTASERVE_CUDA_GEMM_ALGO", "3"},
                          {"DELTASERVE_GEMV_SHAPE", "42"},
                          {"DELTASERVE_FLASH_BN", "32"}});
  EXPECT_TRUE(o.exact_gemm);
  EXPECT_EQ(o.gdn_decode_stage, 2);
  EXPECT_EQ(o.gdn_decode_layout, 44);
  EXPECT_EQ(o.gdn_decode_cluster, 8);
  EXPECT_FALSE(o.pdl);
  EXPECT_TRUE(o.pdl_chain);
  EXPECT_EQ(o.flash_wgmma, 1);
  EXPECT_EQ(o.cublas_workspace_mb, -1);
  EXPECT_EQ(o.gemm_algo, 3);
  EXPECT_EQ(o.gemv_shape, 42);
  EXPECT_EQ(o.flash_keys_per_tile, 32);
  EXPECT_FALSE(parsed({{"DELTASERVE_CUDA_GEMM", "bf16"}}).exact_gemm);
  EXPECT_TRUE(parsed({{"DELTASERVE_CUDA_PDL", "1"}}).pdl);
  EXPECT_EQ(parsed({{"DELTASERVE_CUDA_FLASH_WGMMA", "0"}}).flash_wgmma, 0);
  EXPECT_EQ(parsed({{"DELTASERVE_CUDA_FLASH_WGMMA", "auto"}}).flash_wgmma, -1);
}

TEST(CudaOptionEnv, GdnKernelChoices) {
  const CudaOptions mma = parsed({{"DELTASERVE_CUDA_GDN", "mma"}});
  EXPECT_TRUE(mma.gdn_chunked && mma.gdn_chunked_mma && !mma.gdn_thread_per_row);
  const CudaOptions chunked = parsed({{"DELTASERVE_CUDA_GDN", "chunked"}});
  EXPECT_TRUE(chunked.gdn_chunked && !chunked.gdn_chunked_mma && !chunked.gdn_thread_per_row);
  const CudaOptions rows = parsed({{"DELTASERVE_CUDA_GDN", "rows"}});
  EXPECT_TRUE(!rows.gdn_chunked && !rows.gdn_thread_per_row);
  const CudaOptions thread = parsed({{"DELTASERVE_CUDA_GDN", "thread"}});
  EXPECT_TRUE(!thread.gdn_chunked && thread.gdn_thread_per_row);
}

TEST(CudaOptionEnv, AValueOutsideItsSetNamesTheVariableAndWhatItTakes) {
  const std::string m = failure({{"DELTASERVE_CUDA_GDN_LAYOUT", "55"}});
  EXPECT_NE(m.find("DELTASERVE_CUDA_GDN_LAYOUT=55"), std::string::npos) << m;
  EXPECT_NE(m.find("82 or 44"), std::string::npos) << m;
  for (const char* bad : {"", "1x", " 1", "one", "3", "-1", "99999999999"})
    EXPECT_NE(failure({{"DELTASERVE_CUDA_GDN_STAGE", bad}}).find("DELTASERVE_CUDA_GDN_STAGE="), std::string::npos)
        << "'" << bad << "'";
  EXPECT_NE(failure({{"DELTASERVE_CUDA_GEMM", "EXACT"}}).find("exact or bf16"), std::string::npos);
  EXPECT_NE(failure({{"DELTASERVE_CUDA_PDL", "off"}}).find("0 or 1"), std::string::npos);
  EXPECT_NE(failure({{"DELTASERVE_CUDA_GDN_CLUSTER", "3"}}).find("DELTASERVE_CUDA_GDN_CLUSTER"), std::string::npos);
  EXPECT_NE(failure({{"DELTASERVE_CUDA_GEMM_ALGO", "17"}}).find("1-16"), std::string::npos);
  // One bad variable among good ones is still an error.
  EXPECT_FALSE(cuda_options_from({{"DELTASERVE_CUDA_PDL", "0"}, {"DELTASERVE_FLASH_HB", "9"}}).is_ok());
}

TEST(CudaOptionEnv, AnUnknownNameIsAnErrorListingTheKnownOnes) {
  const std::string m = failure({{"DELTASERVE_CUDA_GDN_STAG", "0"}});
  EXPECT_NE(m.find("DELTASERVE_CUDA_GDN_STAG is not"), std::string::npos) << m;
  EXPECT_NE(m.find("DELTASERVE_CUDA_GDN_STAGE=0, 1 or 2"), std::string::npos) << m;
}

TEST(CudaOptionEnv, EveryKnobInTheTableIsRecognisedAndRejectsGarbage) {
  const std::vector<std::string> names = table_names();
  ASSERT_GE(names.size(), 30u);
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(names[i - 1], names[i]) << "the table is sorted and has no repeats";
    }
    const std::string m = failure({{names[i], "garbage"}});
    EXPECT_NE(m.find(names[i] + "=garbage: it takes "), std::string::npos) << m;
  }
}

TEST(CudaOptionEnv, ReadsOnlyOurVariablesFromTheEnvironment) {
  ASSERT_EQ(setenv("DELTASERVE_CUDA_PDL", "0", 1), 0);
  ASSERT_EQ(setenv("DELTASERVE_FLASH_HB", "2", 1), 0);
  ASSERT_EQ(setenv("DELTASERVE_TP_DEVICES", "0,0", 1), 0);  // not a backend override
  const EnvVariables vars = cuda_option_variables();
  unsetenv("DELTASERVE_CUDA_PDL");
  unsetenv("DELTASERVE_FLASH_HB");
  unsetenv("DELTASERVE_TP_DEVICES");
  // (A developer's own overrides, set before the test, may be there too.)
  EXPECT_TRUE(std::is_sorted(vars.begin(), vars.end()));
  auto value_of = [&](const std::string& name) {
    for (const auto& [k, v] : vars)
      if (k == name) return v;
    return std::string("(absent)");
  };
  EXPECT_EQ(value_of("DELTASERVE_CUDA_PDL"), "0");
  EXPECT_EQ(value_of("DELTASERVE_FLASH_HB"), "2");
  EXPECT_EQ(value_of("DELTASERVE_TP_DEVICES"), "(absent)");
  EXPECT_EQ(value_of("PATH"), "(absent)");
  const CudaOptions o = parsed(vars);
  EXPECT_FALSE(o.pdl);
  EXPECT_EQ(o.flash_heads_per_block, 2);
}

}  // namespace
}  // namespace deltaserve
