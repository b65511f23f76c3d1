#pragma once
//! \file
//! SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; vLLM's and SGLang's "suffix" method):
//! drafts from suffix trees of text already seen, with no model.
//!
//! - `suffix_cache`: the global tree of earlier requests' outputs (each active output inserted as
//!   it grows), shared by every request of a `batch_decoder` and by concurrent decoders, evicted
//!   oldest request first (FIFO) beyond a request count or a memory bound, saved to and loaded
//!   from a checked file so a server restarts warm.
//! - `suffix_proposer`: one request's drafter: a local tree over its prompt and its own output,
//!   and the global cache; the better-scoring draft of the two is proposed (propose/suffix_tree.hpp
//!   says how a tree drafts and scores).
//!
//! Thread safety of `suffix_cache`: every member may be called from any thread. Queries take a
//! shared lock; an append takes the exclusive lock for O(depth) node updates per token. Eviction
//! rebuilds the tree from the kept outputs without holding the lock (readers and writers go on),
//! then takes the exclusive lock only to replay the tokens appended meanwhile and swap the trees.
//! It runs when a request count above `max_requests` or memory above `max_bytes` is seen, and drops
//! the oldest finished outputs until 7/8 of the bound is reached, so that its cost is amortised
//! over the requests that refilled the cache (active outputs are never dropped).
//!
//! File format (version 1, little-endian): a 48-byte header -- "SDSUFFIX", u32 version, u32 depth,
//! u64 sequences, u64 tokens, u64 checksum of the payload, u64 checksum of header bytes [0, 40)
//! (`detail::checksum64`) -- then per sequence a u32 length and its token ids (i32). Loading checks
//! the sizes against the file size before reading, both checksums, every token id, and rebuilds the
//! tree from the sequences (the tree is canonical, so a round trip gives the same drafts).

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/propose/suffix_tree.hpp"

namespace specdec {

//! Configuration of `suffix_cache`.
struct suffix_cache_config {
  std::size_t depth = 24;                        //!< longest suffix kept (as vLLM's default)
  std::size_t max_requests = 10000;              //!< outputs kept, oldest dropped first
  std::size_t max_bytes = std::size_t{1} << 30;  //!< memory bound of the tree
  std::size_t vocab_size = 0;                    //!< token ids checked below it (0: any)

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(depth >= 1 && depth <= suffix_tree::max_depth, invalid_argument,
                  "suffix_cache_config: depth = ", depth, " is outside [1, ",
                  suffix_tree::max_depth, "]");
    SPECDEC_CHECK(max_requests >= 1, invalid_argument,
                  "suffix_cache_config: max_requests must be at least 1");
    SPECDEC_CHECK(max_bytes >= 4096, invalid_argument,
                  "suffix_cache_config: max_bytes = ", max_bytes, " is below 4096");
    SPECDEC_CHECK(vocab_size <= std::size_t{suffix_tree::max_token} + 1, invalid_argument,
                  "suffix_cache_config: vocab_size = ", vocab_size, " is above 2^24");
  }
};

//! The global suffix tree of requests' outputs, thread-safe (see the file comment).
class suffix_cache {
 public:
  using request_id = std::uint64_t;  //!< an output's handle, from 1
  //! The file format version `save` writes and `load` reads.
  static constexpr std::uint32_t format_version = 1;

  //! An empty cache (`config` validated: `errc::invalid_argument`).
  explicit suffix_cache(suffix_cache_config config = {})
      : config_((config.validate(), config)), tree_(config_.depth) {}
  suffix_cache(suffix_cache const&) = delete;
  suffix_cache& operator=(suffix_cache const&) = delete;

  //! Starts a new output (empty) and returns its handle.
  request_id start() {
    std::unique_lock lock(mutex_);
    request_id const id = next_id_++;
    entries_.push_back({id, tree_.add_sequence(), true});
    return id;
  }

  //! Appends `tokens` to the active output `id`. Throws `errc::invalid_argument` for a handle
  //! that is unknown, finished or evicted, `errc::out_of_range` for a token id outside the
  //! vocabulary.
  void append(request_id id, std::span<token_id const> tokens) {
    if (tokens.empty()) return;
    check_tokens(tokens, "suffix_cache::append");
    std::unique_lock lock(mutex_);
    entry const& e = find(id);
    SPECDEC_CHECK(e.active, invalid_argument, "suffix_cache: output ", id, " is finished");
    tree_.extend(e.seq, tokens);
  }

  //! Ends output `id` (it stays in the tree until evicted). Unknown handles are ignored (an
  //! output that was evicted, or never started).
  void finish(request_id id) {
    bool over = false;
    {
      std::unique_lock lock(mutex_);
      auto const it = lookup(id);
      if (it == entries_.end() || !it->active) return;
      it->active = false;
      tree_.finish(it->seq);
      over = over_limits();
    }
    if (over) evict();
  }

  //! Drafts the continuation of `context` from the tree (`suffix_tree::speculate`).
  void speculate(std::span<token_id const> context, suffix_speculation const& how,
                 suffix_draft& out, suffix_workspace& work) const {
    std::shared_lock lock(mutex_);
    tree_.speculate(context, how, out, work);
  }

  //! Writes every output kept (oldest first, active ones as they are now) to `path`, through a
  //! temporary file renamed into place. Throws `errc::io` when it cannot be written.
  void save(std::filesystem::path const& path) const {
    std::shared_lock lock(mutex_);
    detail::checksum64 sum;
    std::uint64_t tokens = 0;
    for (entry const& e : entries_) {
      std::span<token_id const> const q = tree_.sequence_tokens(e.seq);
      auto const length = static_cast<std::uint32_t>(q.size());
      sum.update(std::as_bytes(std::span(&length, 1)));
      sum.update(std::as_bytes(q));
      tokens += q.size();
    }
    std::byte header[header_size] = {};
    auto const put = [&](std::size_t off, auto v) { std::memcpy(header + off, &v, sizeof v); };
    std::memcpy(header, magic, 8);
    put(8, format_version);
    put(12, static_cast<std::uint32_t>(config_.depth));
    put(16, static_cast<std::uint64_t>(entries_.size()));
    put(24, tokens);
    put(32, sum.digest());
    put(40, detail::checksum64::of(std::span<std::byte const>(header, 40)));
    std::filesystem::path tmp = path;
    tmp += ".tmp";
    {
      detail::binary_writer out(tmp);
      out.write_bytes(header, header_size);
      for (entry const& e : entries_) {
        std::span<token_id const> const q = tree_.sequence_tokens(e.seq);
        out.write(static_cast<std::uint32_t>(q.size()));
        out.write_bytes(q.data(), q.size_bytes());
      }
      out.close();
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    SPECDEC_CHECK(!ec, io, "suffix_cache: cannot rename '", tmp.string(), "' to '", path.string(),
                  "': ", ec.message());
  }

  //! Adds the outputs saved in `path` as finished outputs, in their saved order, after the outputs
  //! kept now (so they are the newest), then evicts beyond the bounds. The file is checked
  //! completely before anything is added. Throws `errc::io` when it cannot be read,
  //! `errc::bad_file` when it is truncated, corrupt or not a suffix cache (or holds a token id
  //! outside the vocabulary), `errc::unsupported` for another format version.
  void load(std::filesystem::path const& path, file_access access = file_access::read) {
    auto const file = mapped_file::open(path, access);
    std::string const where = "suffix_cache: '" + path.string() + "'";
    std::span<std::byte const> const bytes = file->bytes();
    detail::byte_reader r(bytes, where);
    std::span<std::byte const> const magic_bytes = r.take(8, "the header");
    SPECDEC_CHECK(std::memcmp(magic_bytes.data(), magic, 8) == 0, bad_file, where,
                  ": not a suffix cache (bad magic)");
    auto const version = r.read<std::uint32_t>("the version");
    SPECDEC_CHECK(version == format_version, unsupported, where, ": format version ", version,
                  ", this build reads version ", format_version);
    (void)r.read<std::uint32_t>("the depth");  // the writer's; the sequences fit any depth
    auto const sequences = r.read<std::uint64_t>("the number of sequences");
    auto const tokens = r.read<std::uint64_t>("the number of tokens");
    auto const payload_sum = r.read<std::uint64_t>("the payload checksum");
    SPECDEC_CHECK(detail::checksum64::of(bytes.first(40)) == r.read<std::uint64_t>("the header "
                                                                                   "checksum"),
                  bad_file, where, ": the header checksum does not match (corrupt header)");
    std::uint64_t const payload = r.remaining();
    SPECDEC_CHECK(
        sequences <= payload / 4 && tokens <= payload / 4 && 4 * (sequences + tokens) == payload,
        bad_file, where, ": ", sequences, " sequences of ", tokens, " tokens in all need ",
        4 * (sequences + tokens), " payload bytes, the file has ", payload,
        payload < 4 * (sequences + tokens) ? " (truncated)" : "");
    SPECDEC_CHECK(detail::checksum64::of(bytes.subspan(header_size)) == payload_sum, bad_file,
                  where, ": the payload checksum does not match (corrupt file)");
    std::size_t const vocab =
        config_.vocab_size != 0 ? config_.vocab_size : std::size_t{suffix_tree::max_token} + 1;
    std::vector<std::span<token_id const>> spans;
    spans.reserve(static_cast<std::size_t>(sequences));
    std::uint64_t seen = 0;
    for (std::uint64_t s = 0; s < sequences; ++s) {
      auto const length = r.read<std::uint32_t>("a sequence length");
      SPECDEC_CHECK(length <= tokens - seen, bad_file, where, ": sequence ", s, " of ", length,
                    " tokens overruns the ", tokens, " tokens the header gives");
      std::span<std::byte const> const raw = r.take(std::uint64_t{length} * 4, "a sequence");
      seen += length;
      // 4-byte aligned: the file's bytes start aligned and every field before is 4 or 8 bytes.
      std::span<token_id const> const q(reinterpret_cast<token_id const*>(raw.data()), length);
      for (std::size_t i = 0; i < q.size(); ++i)
        SPECDEC_CHECK(q[i] >= 0 && static_cast<std::size_t>(q[i]) < vocab, bad_file, where,
                      ": token ", i, " of sequence ", s, " is ", q[i],
                      ", outside the vocabulary of ", vocab);
      spans.push_back(q);
    }
    SPECDEC_CHECK(seen == tokens, bad_file, where, ": the sequences hold ", seen,
                  " tokens, the header says ", tokens);
    bool over = false;
    {
      std::unique_lock lock(mutex_);
      for (std::span<token_id const> const q : spans) {
        suffix_tree::sequence_id const s = tree_.add_sequence();
        tree_.extend(s, q);
        tree_.finish(s);
        entries_.push_back({next_id_++, s, false});
      }
      over = over_limits();
    }
    if (over) evict();
  }

  //! Outputs kept (active and finished).
  [[nodiscard]] std::size_t requests() const {
    std::shared_lock lock(mutex_);
    return entries_.size();
  }
  //! Tokens kept.
  [[nodiscard]] std::size_t tokens() const {
    std::shared_lock lock(mutex_);
    return tree_.num_tokens();
  }
  //! Nodes of the tree, root included.
  [[nodiscard]] std::size_t nodes() const {
    std::shared_lock lock(mutex_);
    return tree_.num_nodes();
  }
  //! Bytes held by the tree (`suffix_tree::memory_bytes`).
  [[nodiscard]] std::size_t memory_bytes() const {
    std::shared_lock lock(mutex_);
    return tree_.memory_bytes();
  }
  //! Outputs dropped by eviction so far.
  [[nodiscard]] std::size_t evicted() const {
    std::shared_lock lock(mutex_);
    return evicted_;
  }
  //! The tree's invariants (`suffix_tree::check`): empty when they hold.
  [[nodiscard]] std::string check() const {
    std::shared_lock lock(mutex_);
    return tree_.check();
  }
  //! The tokens of output `id` (a copy). Throws `errc::invalid_argument` for an unknown handle.
  [[nodiscard]] std::vector<token_id> output(request_id id) const {
    std::shared_lock lock(mutex_);
    std::span<token_id const> const q = tree_.sequence_tokens(find(id).seq);
    return {q.begin(), q.end()};
  }
  //! The configuration (validated).
  [[nodiscard]] suffix_cache_config const& config() const noexcept { return config_; }

 private:
  static constexpr std::size_t header_size = 48;
  static constexpr char magic[9] = "SDSUFFIX";

  struct entry {
    request_id id;
    suffix_tree::sequence_id seq;
    bool active;
  };

  void check_tokens(std::span<token_id const> tokens, char const* where) const {
    std::size_t const vocab =
        config_.vocab_size != 0 ? config_.vocab_size : std::size_t{suffix_tree::max_token} + 1;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      SPECDEC_CHECK(tokens[i] >= 0 && static_cast<std::size_t>(tokens[i]) < vocab, out_of_range,
                    where, ": token ", i, " is ", tokens[i], ", outside the vocabulary of ", vocab);
  }

  //! The entry of `id` (entries are in increasing id order), or end().
  [[nodiscard]] std::deque<entry>::iterator lookup(request_id id) {
    auto const it = std::lower_bound(entries_.begin(), entries_.end(), id,
                                     [](entry const& e, request_id v) { return e.id < v; });
    return it != entries_.end() && it->id == id ? it : entries_.end();
  }
  [[nodiscard]] entry const& find(request_id id) const {
    auto const it = std::lower_bound(entries_.begin(), entries_.end(), id,
                                     [](entry const& e, request_id v) { return e.id < v; });
    SPECDEC_CHECK(it != entries_.end() && it->id == id, invalid_argument, "suffix_cache: output ",
                  id, " is unknown (never started, or evicted)");
    return *it;
  }

  [[nodiscard]] bool over_limits() const {
    return entries_.size() > config_.max_requests || tree_.memory_bytes() > config_.max_bytes;
  }

  //! Brings the cache back within its bounds. A thread that finds another one evicting leaves
  //! a request the evicting thread honours before it lets go, so no over-limit state is left
  //! behind by a race (the bounds hold once every thread has returned).
  void evict() {
    evict_requested_.store(true);
    while (evict_requested_.load()) {
      std::unique_lock maintaining(maintain_, std::try_to_lock);
      if (!maintaining.owns_lock()) return;  // the evicting thread sees the request
      while (evict_requested_.exchange(false)) evict_once();
      // A request made after the exchange, by a thread that failed try_lock before the unlock,
      // is seen by the loop condition once `maintaining` is released.
    }
  }

  //! Drops the oldest finished outputs down to 7/8 of the bounds (see the file comment).
  void evict_once() {
    struct kept {
      request_id id;
      std::vector<token_id> tokens;
      bool active;
    };
    std::vector<kept> keep;
    request_id newest_dropped = 0;  // every finished output up to it is dropped
    std::size_t dropped = 0;
    {
      std::shared_lock lock(mutex_);
      if (!over_limits()) return;
      std::size_t const target_requests = config_.max_requests - config_.max_requests / 8;
      std::size_t const memory = tree_.memory_bytes();
      std::size_t target_tokens = tree_.num_tokens();
      if (memory > config_.max_bytes)
        target_tokens = static_cast<std::size_t>(static_cast<double>(tree_.num_tokens()) * 0.875 *
                                                 static_cast<double>(config_.max_bytes) /
                                                 static_cast<double>(memory));
      std::size_t requests = entries_.size();
      std::size_t tokens = tree_.num_tokens();
      for (entry const& e : entries_) {
        if (requests <= target_requests && tokens <= target_tokens) break;
        if (e.active) continue;
        newest_dropped = e.id;
        --requests;
        tokens -= tree_.sequence_tokens(e.seq).size();
        ++dropped;
      }
      if (dropped == 0) return;  // only active outputs: nothing may go
      for (entry const& e : entries_) {
        if (!e.active && e.id <= newest_dropped) continue;
        std::span<token_id const> const q = tree_.sequence_tokens(e.seq);
        keep.push_back({e.id, {q.begin(), q.end()}, e.active});
      }
    }
    // Build the new tree from the kept outputs, outside the lock.
    suffix_tree fresh(config_.depth);
    std::vector<suffix_tree::sequence_id> ids;
    ids.reserve(keep.size());
    for (kept const& k : keep) {
      ids.push_back(fresh.add_sequence());
      fresh.extend(ids.back(), k.tokens);
      if (!k.active) fresh.finish(ids.back());
    }
    std::unique_lock lock(mutex_);
    // Replay what changed meanwhile: tokens appended to kept outputs, outputs finished or started.
    std::deque<entry> entries;
    std::size_t next = 0;
    for (entry const& e : entries_) {
      if (next < keep.size() && keep[next].id == e.id) {
        std::span<token_id const> const q = tree_.sequence_tokens(e.seq);
        fresh.extend(ids[next], q.subspan(keep[next].tokens.size()));
        if (!e.active && keep[next].active) fresh.finish(ids[next]);
        entries.push_back({e.id, ids[next], e.active});
        ++next;
      } else if (e.id > newest_dropped || e.active) {
        suffix_tree::sequence_id const s = fresh.add_sequence();
        fresh.extend(s, tree_.sequence_tokens(e.seq));
        if (!e.active) fresh.finish(s);
        entries.push_back({e.id, s, e.active});
      }
    }
    tree_ = std::move(fresh);
    entries_ = std::move(entries);
    evicted_ += dropped;
  }

  suffix_cache_config config_;
  mutable std::shared_mutex mutex_;
  std::mutex maintain_;                       //!< one eviction at a time
  std::atomic<bool> evict_requested_{false};  //!< an eviction is wanted (see `evict`)
  suffix_tree tree_;
  std::deque<entry> entries_;  //!< oldest first (increasing ids)
  request_id next_id_ = 1;
  std::size_t evicted_ = 0;
};

//! Configuration of `suffix_proposer`.
struct suffix_config {
  suffix_speculation speculation;  //!< how each tree drafts (`max_tokens` is the node budget)
  std::size_t depth = 24;          //!< longest suffix of the local tree

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    speculation.validate();
    SPECDEC_CHECK(depth >= 1 && depth <= suffix_tree::max_depth, invalid_argument,
                  "suffix_config: depth = ", depth, " is outside [1, ", suffix_tree::max_depth,
                  "]");
  }
};

namespace detail {
//! A request's output in a `suffix_cache`, finished when this handle is destroyed or reset
//! (move-only: the moved-from handle holds none). The cache must outlive it.
class suffix_output {
 public:
  suffix_output() = default;
  suffix_output(suffix_output&& other) noexcept
      : cache_(other.cache_), id_(std::exchange(other.id_, 0)) {}
  suffix_output& operator=(suffix_output&&) = delete;
  ~suffix_output() { reset(); }

  //! Finishes the current output, if any, and starts a new one in `cache`.
  void start(suffix_cache& cache) {
    reset();
    cache_ = &cache;
    id_ = cache.start();
  }
  //! Finishes the current output, if any.
  void reset() noexcept {
    if (id_ != 0) {
      try {
        cache_->finish(id_);
      } catch (...) {  // eviction could not allocate: the output stays, active
      }
    }
    id_ = 0;
  }
  //! The output's handle in the cache (0: none).
  [[nodiscard]] suffix_cache::request_id id() const noexcept { return id_; }
  //! Appends `tokens` to the output, when there is one.
  void append(std::span<token_id const> tokens) const {
    if (id_ != 0) cache_->append(id_, tokens);
  }

 private:
  suffix_cache* cache_ = nullptr;
  suffix_cache::request_id id_ = 0;
};
}  // namespace detail

//! Where a `suffix_proposer`'s draft came from.
enum class suffix_source { none, local, global };

//! SuffixDecoding for one request (see the file comment): drafts from its own text and from a
//! shared `suffix_cache`. Deterministic candidates (no q rows): pair with `greedy_verifier` under
//! greedy decoding and `tree_verifier` under sampling (point masses, lossless). Move-only: it
//! holds its output's handle in the cache, finished when the proposer is destroyed or begins
//! another request.
class suffix_proposer {
 public:
  static constexpr bool produces_trees = true;   //!< tree mode drafts trees
  static constexpr bool samples_drafts = false;  //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = false;

  //! A proposer drafting from its request's own text and from `cache` (null: from its own text
  //! alone), with `config` (validated: `errc::invalid_argument`).
  explicit suffix_proposer(std::shared_ptr<suffix_cache> cache, suffix_config config = {})
      : cache_(std::move(cache)),
        config_((config.validate(), config)),
        local_(config_.depth),
        sequence_(local_.add_sequence()) {}

  //! Starts a request: the local tree holds the prompt; a new output starts in the cache.
  void begin(std::span<token_id const> prompt) {
    output_.reset();
    restart_local(prompt);
    if (cache_) output_.start(*cache_);
  }

  //! Drafts under ctx.tokens.back() at most min(max_tokens, ctx.max_nodes) nodes: the
  //! better-scoring draft of the local tree and the cache (the local one on ties).
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "suffix_proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    if (tree.has_q()) tree.enable_q(0);
    sync(ctx.tokens);
    suffix_speculation how = config_.speculation;
    how.max_tokens = std::min({how.max_tokens, ctx.max_nodes, tree.capacity() - 1});
    source_ = suffix_source::none;
    if (how.max_tokens == 0) return;
    local_.speculate(ctx.tokens, how, local_draft_, work_);
    suffix_draft const* best = &local_draft_;
    source_ = suffix_source::local;
    if (cache_) {
      cache_->speculate(ctx.tokens, how, global_draft_, work_);
      if (global_draft_.score > local_draft_.score) {
        best = &global_draft_;
        source_ = suffix_source::global;
      }
    }
    if (best->size() == 0) {
      source_ = suffix_source::none;
      return;
    }
    ++drafted_from_[static_cast<std::size_t>(source_)];
    slots_.resize(best->size());
    for (std::size_t i = 0; i < best->size(); ++i) {
      std::int32_t const p = best->parents[i];
      slots_[i] = tree.add_node(p < 0 ? 0 : slots_[static_cast<std::size_t>(p)], best->tokens[i]);
    }
  }

  //! Nothing: the committed tokens join the local tree and the output at the next `propose`, from
  //! its context (a step's result may hold tokens past the request's end that are never
  //! emitted, which the cache must not take for output; the last step's tokens are left out).
  void accept(verify_result const&) noexcept {}

  //! The node budget: `speculation.max_tokens`.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return config_.speculation.max_tokens; }
  //! The configuration (validated).
  [[nodiscard]] suffix_config const& config() const noexcept { return config_; }
  //! Where the last draft came from.
  [[nodiscard]] suffix_source last_source() const noexcept { return source_; }
  //! Drafts proposed from the local tree and from the cache so far.
  [[nodiscard]] std::size_t drafts_from(suffix_source s) const noexcept {
    return drafted_from_[static_cast<std::size_t>(s)];
  }
  //! The local tree (prompt and output).
  [[nodiscard]] suffix_tree const& local() const noexcept { return local_; }
  //! The request's output handle in the cache (0 when none).
  [[nodiscard]] suffix_cache::request_id output() const noexcept { return output_.id(); }

 private:
  void restart_local(std::span<token_id const> tokens) {
    local_.clear();
    sequence_ = local_.add_sequence();
    local_.extend(sequence_, tokens);
  }

  //! Tokens committed after the history: to the local tree and the output.
  void add(std::span<token_id const> tokens) {
    if (tokens.empty()) return;
    local_.extend(sequence_, tokens);
    output_.append(tokens);
  }

  //! Brings the history up to `tokens`; restarts the local tree when `tokens` does not extend it
  //! (a caller that did not call `begin`, or edited its sequence).
  void sync(std::span<token_id const> tokens) {
    std::span<token_id const> const history = local_.sequence_tokens(sequence_);
    if (!detail::extends_history(history, tokens) || history.empty()) {
      restart_local(tokens);
      if (cache_ && output_.id() == 0) output_.start(*cache_);
      return;
    }
    add(tokens.subspan(history.size()));
  }

  std::shared_ptr<suffix_cache> cache_;
  suffix_config config_;
  suffix_tree local_;
  suffix_tree::sequence_id sequence_ = 0;
  detail::suffix_output output_;  //!< the request's output in cache_ (declared after it)
  suffix_draft local_draft_;
  suffix_draft global_draft_;
  suffix_workspace work_;
  std::vector<node_index> slots_;  //!< draft-tree index of each drafted token
  suffix_source source_ = suffix_source::none;
  std::array<std::size_t, 3> drafted_from_ = {};
};

}  // namespace specdec
