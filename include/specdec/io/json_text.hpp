// JSON text parsed strictly: parse_json_no_duplicates(text, what, &json) refuses a key repeated
// within one object at any depth (nlohmann, like Python's json, keeps the last value silently),
// so a config.json, tokenizer_config.json, safetensors header or index that says two things is an
// error naming the key, never the later of them. `what` names the document in errors.
#pragma once

#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/status.hpp"

namespace specdec::io {

inline Status parse_json_no_duplicates(std::string_view text, std::string const& what,
                                       nlohmann::json* out) {
  std::vector<std::set<std::string, std::less<>>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event,
                      nlohmann::json& parsed) -> bool {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty() && parsed.is_string()) {
      std::string const& k = parsed.get_ref<std::string const&>();
      if (!open_objects.back().insert(k).second && duplicate.empty()) {
        duplicate = k;
        duplicate_depth = depth;
      }
    }
    return true;
  };
  try {
    *out = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (nlohmann::json::exception const& e) {
    return Status::MalformedInput(what + ": not valid JSON: " + e.what());
  } catch (std::exception const& e) {
    return Status::MalformedInput(what + ": cannot parse: " + e.what());
  }
  if (!duplicate.empty()) {
    if (duplicate_depth == 1) {
      return Status::MalformedInput(what + ": duplicate key \"" + duplicate +
                                    "\" at the top level");
    }
    return Status::MalformedInput(what + ": duplicate key \"" + duplicate +
                                  "\" in a nested object");
  }
  return Status::Ok();
}

}  // namespace specdec::io
