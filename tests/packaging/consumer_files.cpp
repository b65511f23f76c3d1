// A project that reads the model files of JSON formats (specdec::files, <specdec/files.hpp>) from
// an installed package or a subdirectory, with -Werror: a Medusa config, a tree file and a
// safetensors file it writes itself, each read back and checked.
#include <specdec/files.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

int main() {
  namespace sd = specdec;
  sd::medusa_config const c =
      sd::parse_medusa_config(R"({"medusa_num_heads": 3, "medusa_num_layers": 1})", "config.json");
  sd::tree_choices const tree = sd::parse_tree_choices("[[0], [1], [0, 0]]", "tree.json");
  std::filesystem::path const path = std::filesystem::temp_directory_path() / "consumer_files.st";
  std::vector<float> const values{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  sd::safetensors_output const tensor{.name = "w", .shape = {2, 3}, .data = values};
  sd::write_safetensors(path, std::span<sd::safetensors_output const>(&tensor, 1));
  sd::safetensors_file const file(path);
  std::vector<float> const back = file.read("w");
  std::filesystem::remove(path);
  bool const ok = c.num_heads == 3 && c.num_layers == 1 && tree.size() == 3 &&
                  tree[2] == std::vector<std::int32_t>{0, 0} && back == values;
  std::printf("files: medusa heads %zu, tree paths %zu, tensor of %zu floats: %s\n", c.num_heads,
              tree.size(), back.size(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
