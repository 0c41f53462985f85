// specdec umbrella, host-safe: core types, policies, dispatch, checkpoint I/O and every op's front door with the
// CPU executor. Include specdec/specdec.cuh from CUDA translation units to get the CUDA
// overloads of the same front doors as well.
#pragma once

#include "specdec/core/dispatch.hpp"
#include "specdec/core/dtype.hpp"
#include "specdec/core/executor.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/mapped_file.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"
#include "specdec/ops/sample/sample.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "specdec/ops/verify_greedy/verify_greedy.hpp"
#include "specdec/ops/verify_sample/verify_sample.hpp"
#include "specdec/policy/draft.hpp"
#include "specdec/policy/graph.hpp"
#include "specdec/policy/layers.hpp"
#include "specdec/policy/spec_policy.hpp"
#include "specdec/policy/tree.hpp"
