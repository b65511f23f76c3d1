#pragma once
//! \file
//! The model files whose format is JSON, or carries JSON: safetensors (its header), Medusa and
//! Hydra heads directories (config.json, tree.json), EAGLE head and block drafter directories, and
//! the writers of heads directories; and JSON Schema output constraints
//! (sampling/json_schema.hpp). They need nlohmann/json (CMake target `specdec::files`, the `files`
//! component of the package); everything else is in specdec/specdec.hpp, which needs only the
//! standard library.

#include "specdec/model/block_drafter_file.hpp"
#include "specdec/model/eagle_file.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/heads_writer.hpp"
#include "specdec/model/safetensors.hpp"
#include "specdec/sampling/json_schema.hpp"
