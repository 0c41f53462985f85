// Uses the installed specdec through find_package: builds a 3-node tree with the CPU executor,
// checks its ancestor masks, and checks that the policy rules reject a silent-override config.
#include <specdec/specdec.hpp>

#include <cstdio>
#include <vector>

int main() {
  // root -> 1 -> 2
  std::vector<int32_t> parents = {-1, 0, 1}, prefix = {5};
  std::vector<uint32_t> mask(3);
  std::vector<int32_t> depth(3), positions(3), first_child(3), next_sibling(3), leaf_paths(9),
      leaf_count(1), status(1);
  specdec::ops::TreeBuildParams p;
  p.tree = specdec::TreeInput{nullptr, parents.data(), nullptr, 1, 3};
  p.prefix_len = prefix.data();
  p.out = specdec::TreeTopology{mask.data(),         depth.data(),        positions.data(),
                                first_child.data(),  next_sibling.data(), leaf_paths.data(),
                                leaf_count.data(),   status.data(),       3};
  specdec::Status const built = specdec::ops::tree_build(specdec::CpuExecutor{}, p);
  if (!built.ok() || mask != std::vector<uint32_t>{1u, 3u, 7u} || positions[2] != 7) {
    std::printf("tree_build through the installed headers gave a wrong result: %s\n",
                built.to_string().c_str());
    return 1;
  }
  specdec::SpecConfig config;
  config.algorithm = "EAGLE3";
  config.layers = {1, 29, 57};
  config.eagle_topk = 1;
  config.num_steps = 1;
  config.num_draft_tokens = 16;  // SGLang would silently turn this into 2
  specdec::Status const rejected = specdec::validate(config);
  if (rejected.ok()) return 1;
  std::printf("specdec consumer: tree ok; config rejected: %s\n", rejected.message().c_str());
  return 0;
}
