// The one case list declared in cases.h. Edge shapes are built from the tile constants of
// src/cuda/tile_sizes.h (around(tile) = tile - 1, tile, tile + 1; steps of the alignment where the
// kernel takes only aligned sizes), then the hand-picked shapes that earlier lists carried (kept
// so that no shape is lost), duplicates of an earlier shape dropped. Everything is deterministic:
// the random shapes come from their own draws of std::mt19937_64.
#include "cases.h"

#include <random>
#include <utility>

#include "cuda/tile_sizes.h"

namespace latentkv::testing {
namespace {

namespace tiles = latentkv::detail::tiles;

// Multiply-adds of the float64 reference (T*D*R + 2*T*R*N); under this a case is cpu-cheap (the
// founding case is 9.4 M, T = 733 at the founding dims 18 M).
constexpr double kCheapMultiplyAdds = 5e7;

// cuda-fused takes its resident configuration from 2 tiles per SM on; this many 16-token tiles
// reach it on every GPU with up to 160 SMs (an H200 has 132).
constexpr int64_t kResidentEdgeTiles = 2 * 160;

double multiply_adds(const Problem& p) {
  return static_cast<double>(p.tokens()) *
         (static_cast<double>(p.model_dim) * p.rank + 2.0 * p.rank * p.kv_width());
}

// tags with kCpuCheap set from p's cost.
uint32_t with_cost(const Problem& p, uint32_t tags) {
  tags &= ~static_cast<uint32_t>(kCpuCheap);
  return multiply_adds(p) <= kCheapMultiplyAdds ? tags | kCpuCheap : tags;
}

bool same_shape(const Problem& a, const Problem& b) {
  return a.batch == b.batch && a.seq == b.seq && a.model_dim == b.model_dim && a.rank == b.rank &&
         a.heads == b.heads && a.head_dim == b.head_dim && a.dtype == b.dtype;
}

// A list under construction: adds a case unless its shape is there already; sets cpu-cheap from
// the case's cost.
class CaseList {
 public:
  void add(std::string name, const Problem& p, uint32_t tags) {
    for (const Case& c : cases_) {
      if (same_shape(c.problem, p)) return;
    }
    cases_.push_back({std::move(name), p, with_cost(p, tags)});
  }
  std::vector<Case> take() { return std::move(cases_); }

 private:
  std::vector<Case> cases_;
};

// tile - step, tile, tile + step, the values that are positive.
std::vector<int64_t> around(int64_t tile, int64_t step = 1) {
  std::vector<int64_t> v;
  for (int64_t x : {tile - step, tile, tile + step}) {
    if (x > 0) v.push_back(x);
  }
  return v;
}

std::string dims_id(const Problem& p) {
  return "b" + std::to_string(p.batch) + "-s" + std::to_string(p.seq) + "-d" +
         std::to_string(p.model_dim) + "-r" + std::to_string(p.rank) + "-h" +
         std::to_string(p.heads) + "-dh" + std::to_string(p.head_dim);
}

Problem with_dtype(Problem p, DType dtype) {
  p.dtype = dtype;
  return p;
}

// Uniform integer in [lo, hi]; the modulo bias is irrelevant for ranges this small.
int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

// The edge shapes that lists before this one carried by hand (C++ tests, Python tests), kept as
// they were: token splits across batches, everything odd, D/R/N around the blocks.
void add_hand_edges(CaseList* list) {
  constexpr uint32_t kTags = kAllDtypes;
  auto add = [&](const Problem& p) { list->add("hand-" + dims_id(p), p, kTags); };
  const int64_t token_splits[][2] = {{1, 1},  {5, 1},  {2, 3},  {7, 1},  {1, 11}, {3, 4},
                                     {1, 13}, {3, 5},  {2, 8},  {1, 17}, {1, 23}, {4, 6},
                                     {5, 5},  {1, 31}, {4, 8},  {3, 11}, {1, 47}, {6, 8},
                                     {7, 7},  {7, 9},  {1, 64}, {5, 13}, {1, 733}};
  for (const auto& bs : token_splits) add(shape(bs[0], bs[1], 256, 48, 4, 32));
  for (int64_t t : {1, 5, 17, 33}) add(shape(1, t, 37, 19, 3, 11));
  for (int64_t d : {1, 3, 5, 255, 257, 513}) add(shape(3, 3, d, 16, 2, 8));
  for (int64_t r : {1, 15, 17, 47, 49, 65, 255, 256, 257, 513}) add(shape(2, 3, 40, r, 2, 16));
  const int64_t heads_dims[][2] = {{1, 1}, {7, 1},   {1, 33}, {3, 33},
                                   {5, 3}, {2, 129}, {5, 51}, {1, 257}};
  for (const auto& hd : heads_dims) add(shape(2, 5, 24, 12, hd[0], hd[1]));
  add(shape(1, 1, 1, 1, 1, 1));
  // From the Python tests' list.
  const int64_t python_edges[][6] = {
      {1, 1, 8, 4, 1, 4},     {1, 15, 33, 7, 3, 5},   {1, 16, 64, 16, 2, 8},
      {1, 17, 65, 17, 1, 9},  {2, 8, 255, 63, 5, 7},  {3, 11, 257, 65, 2, 129},
      {1, 33, 256, 1, 4, 32}, {1, 5, 130, 257, 3, 17}, {2, 31, 17, 300, 1, 257},
      {4, 96, 256, 48, 4, 32}, {2, 17, 65, 17, 3, 9}};
  for (const auto& e : python_edges) add(shape(e[0], e[1], e[2], e[3], e[4], e[5]));
}

}  // namespace

std::vector<std::string> tag_names(uint32_t tags) {
  const std::pair<uint32_t, const char*> names[] = {
      {kCpuCheap, "cpu-cheap"},     {kFp32, "fp32"},          {kBf16, "bf16"},
      {kFp16, "fp16"},              {kCpuBlocked, "cpu-blocked"}, {kCudaFused, "cuda-fused"},
      {kCudaGemm, "cuda-gemm"},     {kCudaDecode, "cuda-decode"}};
  std::vector<std::string> out;
  for (const auto& [bit, name] : names) {
    if (tags & bit) out.emplace_back(name);
  }
  return out;
}

Problem shape(int64_t b, int64_t s, int64_t d, int64_t r, int64_t h, int64_t dh) {
  Problem p;
  p.batch = b;
  p.seq = s;
  p.model_dim = d;
  p.rank = r;
  p.heads = h;
  p.head_dim = dh;
  return p;
}

std::vector<Case> preset_cases() {
  CaseList list;
  list.add("seed", shape(4, 96, 256, 48, 4, 32), kAllDtypes | kCpuBlocked | kCudaFused);
  list.add("seed-x16", shape(16, 384, 256, 48, 4, 32), kFp32 | kCudaFused | kCudaGemm);
  list.add("deepseek-v2-lite", shape(1, 64, 2048, 512, 16, 128), kAllDtypes | kCudaGemm);
  list.add("deepseek-v3", shape(1, 128, 7168, 512, 128, 128), kAllDtypes | kCudaGemm);
  return list.take();
}

bool find_preset(const std::string& name, Problem* problem) {
  for (const Case& c : preset_cases()) {
    if (c.name == name) {
      *problem = c.problem;
      return true;
    }
  }
  return false;
}

std::vector<Case> edge_cases() {
  CaseList list;
  // At the founding D, R, H, Dh unless the tile is in D, R or N.
  auto tokens = [&](const std::string& tile, int64_t t, uint32_t tags) {
    list.add(tile + "-t" + std::to_string(t), shape(1, t, 256, 48, 4, 32), kAllDtypes | tags);
  };
  auto model_dim = [&](const std::string& tile, int64_t d, uint32_t tags) {
    list.add(tile + "-d" + std::to_string(d), shape(3, 3, d, 16, 2, 8), kAllDtypes | tags);
  };
  auto rank = [&](const std::string& tile, int64_t r, uint32_t tags) {
    list.add(tile + "-r" + std::to_string(r), shape(2, 3, 40, r, 2, 16), kAllDtypes | tags);
  };
  // N = H*Dh with H = 1 (so a column tile's edge is not also a head's edge) and with H = 2.
  auto width = [&](const std::string& tile, int64_t n, int64_t t, uint32_t tags) {
    list.add(tile + "-n" + std::to_string(n), shape(1, t, 24, 12, 1, n), kAllDtypes | tags);
    if (n % 2 == 0) {
      list.add(tile + "-n" + std::to_string(n) + "-h2", shape(1, t, 24, 12, 2, n / 2),
               kAllDtypes | tags);
    }
  };

  list.add("one-token", shape(1, 1, 256, 48, 4, 32), kAllDtypes | kCudaDecode);
  list.add("all-ones", shape(1, 1, 1, 1, 1, 1), kAllDtypes);

  // cpu-blocked: register tiles of 6 tokens x 16 columns, token tiles of 24, D and R blocks.
  for (int64_t t : around(tiles::kCpuRows)) tokens("cpu-rows", t, kCpuBlocked);
  for (int64_t t : around(tiles::kCpuTileTokens)) tokens("cpu-tile", t, kCpuBlocked);
  for (int64_t t : around(2 * tiles::kCpuTileTokens)) tokens("cpu-tile2", t, kCpuBlocked);
  for (int64_t r : around(tiles::kCpuRegisterCols)) rank("cpu-cols", r, kCpuBlocked);
  for (int64_t n : around(tiles::kCpuRegisterCols)) width("cpu-cols", n, 5, kCpuBlocked);
  for (int64_t d : around(tiles::kCpuDBlock)) model_dim("cpu-dblock", d, kCpuBlocked);
  for (int64_t d : around(2 * tiles::kCpuDBlock)) model_dim("cpu-dblock2", d, kCpuBlocked);
  for (int64_t r : around(tiles::kCpuRBlock)) rank("cpu-rblock", r, kCpuBlocked);
  for (int64_t r : around(2 * tiles::kCpuRBlock)) rank("cpu-rblock2", r, kCpuBlocked);

  // cuda-fused: the streaming tile (few tokens), the resident tile (from 2 tiles per SM on), the
  // 64-column down pass, the up passes over [K | V] (their edges at 2N and at the K|V seam N).
  for (int64_t t : around(tiles::kFusedStreamTokens)) tokens("fused-stream", t, kCudaFused);
  for (int64_t t : around(tiles::kFusedResidentTokens)) tokens("fused-tile16", t, kCudaFused);
  // The resident tile at D = 260 (the token tiles take D <= 256): the aligned calls run the
  // cluster configuration there, the others the resident one.
  for (int64_t t : around(kResidentEdgeTiles * tiles::kFusedResidentTokens)) {
    list.add("fused-resident-t" + std::to_string(t), shape(1, t, 260, 48, 4, 32),
             kAllDtypes | kCudaFused);
  }
  for (int64_t r : around(tiles::kFusedDownCols)) rank("fused-down", r, kCudaFused);
  for (int64_t n : around(tiles::kFusedStreamUpCols / 2)) width("fused-up2n", n, 5, kCudaFused);
  for (int64_t n : around(tiles::kFusedStreamUpCols)) width("fused-upkv", n, 5, kCudaFused);
  for (int64_t n : around(tiles::kFusedResidentUpCols / 2)) {
    const int64_t t = kResidentEdgeTiles * tiles::kFusedResidentTokens + 1;
    list.add("fused-resident-up2n-n" + std::to_string(n), shape(1, t, 260, 12, 1, n),
             kAllDtypes | kCudaFused);
  }
  // cuda-fused's tensor-core configuration (16-byte rows: steps of 4). It runs where the cluster
  // configuration would (the streaming grid of 4-token tiles x column splits past two blocks per
  // SM) while its grid of 8-token tiles x column blocks is one wave: at the founding widths on an
  // H200 (132 SMs), T in [529, 1056]; these shapes are inside that window there (elsewhere they
  // run whichever configuration takes them). T at the window's ends and one past each, a full
  // last tile, batch edges inside a tile, a warp's 16 rows of w_down and the limit of 256, R
  // around the down product's 16-row tiles and the limit of 64, 2N around a block's 256 columns
  // (past it, a second column block whose one up tile is partial), and D, R, N off their tiles at
  // once. (2N within one 16-column tile never reaches it there: the streaming grid stays small.)
  {
    constexpr int64_t kSms = 132;
    // "fused-<configuration>-<edge>-t<T>-d<D>-r<R>-n<N>".
    auto fused_case = [&](const std::string& config, const std::string& edge, const Problem& p) {
      const auto dims = "-t" + std::to_string(p.tokens()) + "-d" + std::to_string(p.model_dim) +
                        "-r" + std::to_string(p.rank) + "-n" + std::to_string(p.kv_width());
      list.add("fused-" + config + "-" + edge + dims, p, kAllDtypes | kCudaFused);
    };
    auto tc = [&](const std::string& edge, const Problem& p) { fused_case("tc", edge, p); };
    for (int64_t t : around(4 * kSms + 1)) tc("first", shape(1, t, 256, 48, 4, 32));
    tc("tile", shape(1, 4 * kSms + 8, 256, 48, 4, 32));
    for (int64_t t : around(8 * kSms)) tc("last", shape(1, t, 256, 48, 4, 32));
    tc("batch", shape(3, 181, 256, 48, 4, 32));
    for (int64_t d : around(16, 4)) tc("warp", shape(1, 800, d, 16, 4, 32));
    for (int64_t d : around(tiles::kFusedTcMaxModelDim, 4)) tc("maxd", shape(1, 800, d, 16, 4, 32));
    for (int64_t r : around(16, 4)) tc("r16", shape(1, 800, 40, r, 4, 32));
    for (int64_t r : around(tiles::kFusedTcMaxRank, 4)) tc("maxr", shape(1, 800, 40, r, 4, 32));
    for (int64_t n : {124, 128}) {
      tc("block", shape(1, 800, 24, 12, 1, n));
      tc("block-h2", shape(1, 800, 24, 12, 2, n / 2));
    }
    tc("block", shape(1, 500, 24, 12, 1, 132));
    tc("block-h2", shape(1, 500, 24, 12, 2, 66));
    tc("odd", shape(1, 500, 100, 40, 3, 44));

    // cuda-fused's register-tile configuration (D <= 256, R <= 64, 16-byte rows), on an H200 at
    // the founding widths: 32 columns a block for T in [3, 16], 256 for T in [17, 64] and
    // [265, 528], the streaming configuration between. T at each edge and one past it, batch
    // edges inside a tile, D around its limit of 256 (past it the streaming configuration), R
    // around the warps' 8 columns and the limit of 64, 2N around 32 columns (a block of the
    // few-token grid) and around 256, K | V meeting inside a block (N = 20).
    auto reg = [&](const std::string& edge, const Problem& p) { fused_case("reg", edge, p); };
    for (int64_t t : {2, 3, 16, 17, 64, 65, 264, 265, 528, 529}) {
      reg("edge", shape(1, t, 256, 48, 4, 32));
    }
    reg("batch", shape(3, 7, 256, 48, 4, 32));
    reg("batch", shape(5, 77, 256, 48, 4, 32));
    for (int64_t d : around(tiles::kFusedRegisterTileMaxModelDim, 4)) {
      reg("maxd", shape(1, 9, d, 16, 4, 32));
      reg("maxd", shape(1, 33, d, 16, 4, 32));
    }
    for (int64_t r : around(40, 4)) reg("r40", shape(1, 9, 64, r, 4, 32));
    for (int64_t r : around(tiles::kFusedRegisterTileMaxRank, 4)) {
      reg("maxr", shape(1, 9, 40, r, 4, 32));
      reg("maxr", shape(1, 33, 40, r, 4, 32));
    }
    for (int64_t n : {24, 32, 40}) reg("block32", shape(1, 9, 24, 12, 1, n / 2));
    for (int64_t n : {248, 256, 264}) reg("block256", shape(1, 17, 24, 12, 2, n / 4));
    reg("seam", shape(1, 9, 24, 12, 1, 20));

    // cuda-fused's token-tile configuration (D <= 256, R <= 64): past the streaming grid's two
    // blocks per SM and the tensor-core configuration's one wave, on an H200 (132 SMs) from
    // T = 1057 at the founding widths (from 529 where the rows are not 16-byte vectors). T at that
    // edge, at its tile choices' edges there (2112: the last grid of 16-token tiles, 4224: of 32,
    // 8448: one 64-token tile a block; one more, a block walks two), batch edges inside a tile, D
    // and R around their limits (past them the cluster configuration), 2N around a block's 256
    // columns (past it a second column block) and D, R, N off their K steps at once.
    auto tile_case = [&](const std::string& edge, const Problem& p) {
      fused_case("tiles", edge, p);
    };
    for (int64_t t : around(8 * kSms + 1)) tile_case("first", shape(1, t, 256, 48, 4, 32));
    for (int64_t m : {16, 32, 64}) tile_case("m", shape(1, m * kSms + 1, 256, 48, 4, 32));
    tile_case("m", shape(1, 16 * kSms, 256, 48, 4, 32));
    tile_case("batch", shape(3, 181, 256, 48, 4, 32));
    for (int64_t d : around(tiles::kFusedTilesMaxModelDim, 4)) {
      tile_case("maxd", shape(1, 9 * kSms, d, 16, 4, 32));
    }
    for (int64_t r : around(tiles::kFusedTilesMaxRank, 4)) {
      tile_case("maxr", shape(1, 9 * kSms, 40, r, 4, 32));
    }
    for (int64_t n : {124, 128, 132}) tile_case("block", shape(1, 9 * kSms, 24, 12, 2, n / 2));
    tile_case("odd", shape(1, 9 * kSms, 99, 41, 3, 45));
  }
  // Vector widths: D, R and N one off a multiple of the 16-byte vector (the slow path).
  for (int64_t d : around(tiles::kFusedVectorWidth * 9)) model_dim("fused-vec-d", d, kCudaFused);

  // cuda-decode, float32 and tensor-core, in float32 beyond what cuda-decode takes (decode_cases()
  // has the shapes it takes in every dtype): T past its limit, R past stage 3's registers, D
  // around the row slots and the tensor-core chunk alignment.
  for (int64_t t : around(tiles::kDecodeStreamMaxTokens)) tokens("decode-max", t, kCudaDecode);
  for (int64_t t : around(tiles::kDecodeTcTokens)) tokens("decode-mma", t, kCudaDecode);
  for (int64_t r : around(tiles::kDecodeStreamMaxRank)) rank("decode-maxrank", r, kCudaDecode);
  for (int64_t d : around(tiles::kDecodeStreamDownSlots)) model_dim("decode-slots", d, kCudaDecode);
  for (int64_t d : around(tiles::kDecodeTcDownRowAlign)) {
    model_dim("decode-tc-chunk", d, kCudaDecode);
  }

  add_hand_edges(&list);
  return list.take();
}

std::vector<Case> decode_cases() {
  CaseList list;
  constexpr uint32_t kTags = kAllDtypes | kCudaDecode;
  const int64_t align = tiles::kDecodeTcVectorWidth;  // R and N step: 16-byte rows of bf16/fp16
  auto tokens = [&](const std::string& tile, int64_t b, int64_t s) {
    list.add(tile + "-t" + std::to_string(b * s) + "-b" + std::to_string(b),
             shape(b, s, 300, 48, 4, 32), kTags);
  };
  auto model_dim = [&](const std::string& tile, int64_t d) {
    list.add(tile + "-d" + std::to_string(d), shape(1, 3, d, 64, 2, 64), kTags);
  };
  auto rank = [&](const std::string& tile, int64_t r) {
    list.add(tile + "-r" + std::to_string(r), shape(1, 5, 96, r, 2, 16), kTags);
  };
  auto width = [&](const std::string& tile, int64_t h, int64_t dh) {
    list.add(tile + "-h" + std::to_string(h) + "-dh" + std::to_string(dh),
             shape(2, 1, 64, 24, h, dh), kTags);
  };

  // Tokens: the FFMA kernels' groups of 1, 2 and 4 tokens, and up to the limit (the MMA's M).
  for (int64_t t = 1; t <= tiles::kDecodeStreamMaxGroup + 1; ++t) tokens("group", 1, t);
  for (int64_t t : around(tiles::kDecodeTcTokens)) {
    if (t <= tiles::kDecodeTcTokens) tokens("mma", 1, t);
  }
  // D: the 32-row slots of stage 1, the 64-row TMA box, the tensor-core chunk alignment.
  for (int64_t d : around(tiles::kDecodeStreamDownSlots)) model_dim("slots", d);
  for (int64_t d : around(tiles::kDecodeTcBoxRows)) model_dim("box", d);
  for (int64_t d : around(tiles::kDecodeTcDownRowAlign)) model_dim("chunk", d);
  // R: one MMA column tile, the 32-column stage-1 tile, the up row alignment, stage 3's limit.
  rank("mma-cols", tiles::kDecodeTcMmaCols);
  for (int64_t r : around(tiles::kDecodeStreamDownCols, align)) rank("down-cols", r);
  for (int64_t r : around(tiles::kDecodeTcUpRowAlign, align)) rank("up-rows", r);
  for (int64_t r : around(tiles::kDecodeStreamMaxRank, align)) {
    if (r <= tiles::kDecodeStreamMaxRank) rank("max-rank", r);
  }
  // N: 2N around stage 3's 16-column tile, the tensor-core up tiles of 32 and 64 columns.
  for (int64_t n : around(tiles::kDecodeStreamUpCols / 2, align)) width("up16", 1, n);
  for (int64_t n : around(tiles::kDecodeTcNarrowUpCols, align)) width("up32", 1, n);
  for (int64_t n : around(tiles::kDecodeTcWideUpCols, align)) width("up64", 1, n);

  // The hand-picked list the GPU tests carried: token splits, D across chunks, R up to 512, N
  // with several tiles per persistent block, DeepSeek decode.
  auto add = [&](const Problem& p) { list.add("hand-" + dims_id(p), p, kTags); };
  const int64_t token_splits[][2] = {{1, 1}, {1, 2}, {3, 1}, {1, 4}, {1, 5},  {2, 3},
                                     {7, 1}, {2, 4}, {3, 3}, {1, 13}, {4, 4}, {1, 16}};
  for (const auto& bs : token_splits) add(shape(bs[0], bs[1], 300, 48, 4, 32));
  for (int64_t d : {1, 31, 33, 100, 4128, 7168}) add(shape(1, 3, d, 64, 2, 64));
  for (int64_t r : {8, 56, 64, 72, 504, 512}) add(shape(1, 5, 96, r, 2, 16));
  const int64_t heads_dims[][2] = {{1, 8}, {3, 8}, {5, 8}, {3, 88}, {16, 128}, {128, 136}};
  for (const auto& hd : heads_dims) add(shape(2, 1, 64, 24, hd[0], hd[1]));
  list.add("deepseek-v2-lite-t1", shape(1, 1, 2048, 512, 16, 128), kTags | kCudaGemm);
  list.add("deepseek-v2-lite-t16", shape(4, 4, 2048, 512, 16, 128), kTags | kCudaGemm);
  list.add("deepseek-v3-t1", shape(1, 1, 7168, 512, 128, 128), kTags | kCudaGemm);
  list.add("deepseek-v3-t16", shape(2, 8, 7168, 512, 128, 128), kTags | kCudaGemm);
  return list.take();
}

std::vector<Case> random_cases(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;  // not deduplicated: the i-th draw stays the i-th case
  for (int i = 0; i < count; ++i) {
    const int64_t b = uniform_int(rng, 1, 4), s = uniform_int(rng, 1, 70);
    const int64_t d = uniform_int(rng, 1, 300), r = uniform_int(rng, 1, 80);
    const int64_t h = uniform_int(rng, 1, 6), dh = uniform_int(rng, 1, 48);
    const Problem p = shape(b, s, d, r, h, dh);
    cases.push_back({"random-" + std::to_string(i), p,
                     with_cost(p, kAllDtypes | kCpuBlocked | kCudaFused | kCudaGemm)});
  }
  return cases;
}

std::vector<Case> sweep_cases() {
  // One token, a tile tail, one tile-ish, an odd mid size and the founding case x16, at the
  // founding dims.
  constexpr int64_t kSweepTokens[] = {1, 7, 64, 733, 6144};
  std::vector<Case> presets = preset_cases();
  std::vector<Case> cases = {presets[0], presets[1]};  // seed, seed-x16
  for (int64_t t : kSweepTokens) {
    Case c = presets[0];
    c.name = "T=" + std::to_string(t);
    c.problem.batch = 1;
    c.problem.seq = t;
    cases.push_back(c);
  }
  for (size_t i = 2; i < presets.size(); ++i) cases.push_back(presets[i]);
  for (Case& c : cases) {
    c.problem.dtype = DType::kFloat32;
    c.tags = with_cost(c.problem, (c.tags & ~static_cast<uint32_t>(kBf16 | kFp16)) | kFp32);
  }
  return cases;
}

std::vector<Case> mla_sweep_cases() {
  const struct {
    const char* preset;
    std::vector<int64_t> tokens;
  } rows[] = {{"deepseek-v2-lite", {1, 64, 1024, 8192}}, {"deepseek-v3", {1, 128, 4096}}};
  std::vector<Case> cases;
  for (const auto& row : rows) {
    Problem base;
    find_preset(row.preset, &base);
    for (int64_t t : row.tokens) {
      Problem p = with_dtype(base, DType::kBFloat16);
      p.batch = 1;
      p.seq = t;
      const uint32_t decode = t <= tiles::kDecodeTcTokens ? uint32_t{kCudaDecode} : 0u;
      cases.push_back({std::string(row.preset) + " T=" + std::to_string(t), p,
                       with_cost(p, kBf16 | kCudaGemm | decode)});
    }
  }
  return cases;
}

std::vector<std::string> list_names() {
  return {"preset", "edge", "decode", "random", "sweep", "mla-sweep"};
}

std::vector<Case> cases_named(const std::string& list) {
  if (list == "preset") return preset_cases();
  if (list == "edge") return edge_cases();
  if (list == "decode") return decode_cases();
  if (list == "random") return random_cases(kRandomCount, kRandomSeed);
  if (list == "sweep") return sweep_cases();
  if (list == "mla-sweep") return mla_sweep_cases();
  return {};
}

std::vector<Problem> problems(const std::vector<Case>& cases, uint32_t tags) {
  std::vector<Problem> out;
  for (const Case& c : cases) {
    if (c.has(tags)) out.push_back(c.problem);
  }
  return out;
}

std::vector<Problem> edge_shapes() { return problems(edge_cases()); }

std::vector<Problem> random_shapes(int count, uint64_t seed) {
  return problems(random_cases(count, seed));
}

}  // namespace latentkv::testing
