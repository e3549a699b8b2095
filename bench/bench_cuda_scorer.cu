/* bench_cuda_scorer.cu -- fp4idx-bench-cuda: the CUDA scorer on the five
 * cases of docs/RESULTS.md's method ("Method"), plus a cold-cache variant.
 *
 * Inputs: exact dyadic values (q, w, keys = k/8, keys quantized with RNE on
 * the host), R = 4 verify rows of each sequence seeing the context minus
 * 0..3 keys, keys on shuffled 64-key pages.
 * Method: 20 scorer launches captured in one CUDA graph; one warm-up replay,
 * then 10 replays timed together with CUDA events; time per call = elapsed /
 * 200; the median of 3 such runs. "cold": the 20 calls cycle through 8
 * copies of the page pool (8 x the keys; 60 MB of L2 cannot hold them).
 * Floor: max(2*R*H*128 FLOP per key / 804 TFLOP/s, (68 + 4 + 4R) bytes per
 * key / 4.25 TB/s) -- the H200 rates measured on the device machine.
 * --check: every case's logits compared bit for bit with the CPU backend.
 * The scorer is the device's (fp4idx_cuda_scorer_for_device); --label
 * names this build in the output and the CSV's scorer column (default: the
 * scorer's name), so that two builds run one after the other (the previous
 * kernel as baseline) land in one table and one plot.
 * --ctx N (repeatable): instead of the five cases, 4 rows x 32 heads at
 * context N each (the short contexts' fixed cost against N).
 * --grid N: the plan's grid replaced by N blocks (at most the plan's tiles;
 * the blocks' split of the tiles follows), to time grid sizes.
 * --floor: first, a graph of 20 empty kernels of the scorer's block shape
 * (132 blocks x 512 threads), with and without programmatic dependent
 * launch: the launch floor under every kernel of a graph.
 *
 *   fp4idx-bench-cuda [--check] [--case N]... [--ctx N]... [--grid N] [--floor]
 *                     [--csv FILE] [--label NAME]
 *   fp4idx-bench-cuda --topk [--check] [--csv FILE] [--isolated GAPS]
 *                                                      (bench_cuda_topk.cu)
 */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_cuda_topk.h"
#include "fp4idx_backend.h"
#include "fp4idx_cuda.h"
#include "fp4idx_format.h"
#include "bench_cuda_check.h"
#include "bench_cuda_graph.h"

namespace {

struct Case {
  const char *name;
  int seqs, rows, heads;
  int64_t ctx;
  double sglang_us;
};
const Case kCases[] = {
    {"h32_ctx16384", 1, 4, 32, 16384, 31.9},
    {"h32_ctx100000", 1, 4, 32, 100000, 180.4},
    {"h32_ctx400000", 1, 4, 32, 400000, 701.0},
    {"h64_ctx100000", 1, 4, 64, 100000, 361.7},
    {"s32_h32_ctx32768", 32, 4, 32, 32768, 1937.0},
};
constexpr int kPage = 64, kCaches = 8, kCalls = 20, kReplays = 10, kRuns = 3;
constexpr double kTflops = 804e12, kBw = 4.25e12;


uint64_t rng_state = 0x9E3779B97F4A7C15ull;
uint64_t rnd() {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint16_t eighths(int m) {  // bf16 of k/8, k uniform in [-m, m]
  int k = (int)(rnd() % (2 * m + 1)) - m;
  return fp4idx_f32_to_bf16((float)k / 8.0f);
}

// --floor: an empty kernel (it waits for the previous grid, as a PDL
// kernel must before touching memory).
__global__ void empty_kernel(int *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (p && threadIdx.x == 1024) *p = 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--topk")) return fp4idx_bench_topk_main(argc - 1, argv + 1);
  int check = 0, grid = 0, floor_run = 0;
  std::vector<int> only;
  std::vector<int64_t> ctxs;
  const char *csv = nullptr, *label = nullptr;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) check = 1;
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) only.push_back(atoi(argv[++i]));
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!strcmp(argv[i], "--label") && i + 1 < argc) label = argv[++i];
    else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctxs.push_back(atoll(argv[++i]));
    else if (!strcmp(argv[i], "--grid") && i + 1 < argc) grid = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--floor")) floor_run = 1;
    else {
      fprintf(stderr, "usage: fp4idx-bench-cuda [--check] [--case N]... [--ctx N]... [--grid N]"
                      " [--floor] [--csv FILE] [--label NAME]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  TCK(cudaGetDeviceProperties(&prop, 0));
  fp4idx_cuda_scorer_t scorer;
  if (fp4idx_cuda_scorer_for_device(0, &scorer)) return 1;
  const char *scn = label ? label : scorer == FP4IDX_CUDA_SCORER_WGMMA ? "wgmma" : "mma";
  printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20);
  FILE *cf = csv ? fopen(csv, "w") : nullptr;
  if (cf) fprintf(cf, "case,seqs,rows,heads,ctx,hot_us,cold_us,floor_us,tflops,sglang_us,scorer\n");
  cudaStream_t st;
  TCK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  struct Row { const Case *c; const char *scorer; double hot, cold, floor, tf; const char *chk; };
  std::vector<Row> table;

  if (floor_run) {
    for (int pdl = 0; pdl < 2; pdl++) {
      cudaLaunchAttribute at;
      at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(prop.multiProcessorCount);
      cfg.blockDim = dim3(512);
      cfg.stream = st;
      cfg.attrs = &at;
      cfg.numAttrs = pdl;
      const double us = bench_time_graph(st, kCalls, kReplays, kRuns, [&] {
        return cudaLaunchKernelEx(&cfg, empty_kernel, (int *)nullptr);
      });
      printf("floor: empty kernel %d x 512 in a graph, %s PDL: %.2f us a launch\n",
             prop.multiProcessorCount, pdl ? "with" : "without", us);
    }
  }
  std::vector<Case> cases(kCases, kCases + sizeof kCases / sizeof kCases[0]);
  std::vector<std::string> names;
  if (!ctxs.empty()) {
    cases.clear();
    for (int64_t n : ctxs) names.push_back("h32_ctx" + std::to_string(n));
    for (size_t i = 0; i < ctxs.size(); i++)
      cases.push_back(Case{names[i].c_str(), 1, 4, 32, ctxs[i], 0.0});
  }
  for (int ci = 0; ci < (int)cases.size(); ci++) {
    if (!only.empty() && std::find(only.begin(), only.end(), ci) == only.end()) continue;
    const Case &c = cases[ci];
    const int S = c.seqs, R = c.rows, H = c.heads;
    const int64_t n = c.ctx, pages_per_seq = (n + kPage - 1) / kPage;
    const int64_t n_pages = pages_per_seq * S;
    // Keys: quantized dyadic values, on shuffled pages of one pool.
    std::vector<int32_t> perm(n_pages);
    for (int64_t i = 0; i < n_pages; i++) perm[i] = (int32_t)i;
    for (int64_t i = n_pages - 1; i > 0; i--) std::swap(perm[i], perm[rnd() % (i + 1)]);
    const size_t pool_bytes = (size_t)n_pages * kPage * FP4IDX_SLOT_BYTES;
    std::vector<uint8_t> pool(pool_bytes, 0);
    std::vector<uint8_t> packed((size_t)n * S * 68);
    std::vector<int64_t> slots((size_t)n * S);
    {
      uint16_t key[128];
      for (int s = 0; s < S; s++)
        for (int64_t l = 0; l < n; l++) {
          for (int e = 0; e < 128; e++) key[e] = eighths(48);
          const int64_t slot = (int64_t)perm[s * pages_per_seq + l / kPage] * kPage + l % kPage;
          uint8_t *pay = pool.data() + fp4idx_payload_offset(slot, kPage);
          uint8_t *sc = pool.data() + fp4idx_scale_offset(slot, kPage);
          fp4idx_quantize_key(key, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE, pay, sc);
          memcpy(packed.data() + (s * n + l) * 68, pay, 64);
          memcpy(packed.data() + (s * n + l) * 68 + 64, sc, 4);
          slots[s * n + l] = slot;
        }
    }
    std::vector<uint16_t> q((size_t)S * R * H * 128), w((size_t)S * R * H);
    for (auto &x : q) x = eighths(16);
    for (auto &x : w) x = eighths(16);
    std::vector<int32_t> lens((size_t)S * R);
    for (int s = 0; s < S; s++)
      for (int r = 0; r < R; r++) lens[s * R + r] = (int32_t)(n - r);

    // Device: 8 pool copies, per-sequence inputs, one output buffer.
    uint8_t *dpool[kCaches];
    for (int k = 0; k < kCaches; k++) {
      TCK(cudaMalloc((void **)&dpool[k], pool_bytes));
      TCK(cudaMemcpy(dpool[k], pool.data(), pool_bytes, cudaMemcpyHostToDevice));
    }
    int32_t *dpages, *dlens;
    uint16_t *dq, *dw;
    float *dout;
    TCK(cudaMalloc((void **)&dpages, n_pages * 4));
    TCK(cudaMalloc((void **)&dlens, lens.size() * 4));
    TCK(cudaMalloc((void **)&dq, q.size() * 2));
    TCK(cudaMalloc((void **)&dw, w.size() * 2));
    TCK(cudaMalloc((void **)&dout, (size_t)S * R * n * 4));
    TCK(cudaMemset(dout, 0x7f, (size_t)S * R * n * 4));  // poison: --check sees only kernel writes
    TCK(cudaMemcpy(dpages, perm.data(), n_pages * 4, cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    std::vector<fp4idx_cuda_seq_t> hs(S);
    std::vector<int32_t> rows(S, R);
    std::vector<int64_t> widths(S, n);
    for (int s = 0; s < S; s++) {
      hs[s] = fp4idx_cuda_seq_t{};
      hs[s].pages = dpages + s * pages_per_seq;
      hs[s].q = dq + (size_t)s * R * H * 128;
      hs[s].w = dw + (size_t)s * R * H;
      hs[s].lens = dlens + s * R;
      hs[s].mask = nullptr;
      hs[s].out = dout + (size_t)s * R * n;
      hs[s].width = n;
      hs[s].rows = R;
    }
    fp4idx_cuda_seq_t *dseq;
    TCK(cudaMalloc((void **)&dseq, sizeof(fp4idx_cuda_seq_t) * S));
    TCK(cudaMemcpy(dseq, hs.data(), sizeof(fp4idx_cuda_seq_t) * S, cudaMemcpyHostToDevice));
    const double keys = (double)n * S;
    const double flop = 2.0 * R * H * 128 * keys;
    const double bytes = keys * (68 + 4 + 4.0 * R);
    const double floor_us = 1e6 * std::max(flop / kTflops, bytes / kBw);
    std::vector<float> want;  // CPU backend logits, computed once per case
    int want_rc = 0;
    fp4idx_cuda_work_t *dworks = nullptr;
    {
      const int32_t mw = fp4idx_cuda_score_max_works(H, S, rows.data());
      std::vector<fp4idx_cuda_work_t> works(mw);
      fp4idx_cuda_score_params_t prm;
      int nw = fp4idx_cuda_score_plan(scorer, H, S, rows.data(), widths.data(), prop.multiProcessorCount,
                                      works.data(), mw, &prm);
      if (nw < 0 || nw > mw) { fprintf(stderr, "plan failed\n"); return 1; }
      TCK(cudaMalloc((void **)&dworks, sizeof(fp4idx_cuda_work_t) * nw));
      TCK(cudaMemcpy(dworks, works.data(), sizeof(fp4idx_cuda_work_t) * nw, cudaMemcpyHostToDevice));
      prm.seqs = dseq;
      prm.works = dworks;
      prm.log2_page = 6;
      fp4idx_cuda_score_use_seq0(&prm, works.data(), hs.data());
      if (grid > 0) prm.grid = (int32_t)std::min<int64_t>(grid, prm.total_tiles);

      double t[2] = {0, 0};
      for (int cold = 0; cold < 2; cold++) {
        int call = 0;  // cold: the launches of the graph cycle through kCaches pools
        t[cold] = bench_time_graph(st, kCalls, kReplays, kRuns, [&] {
          fp4idx_cuda_score_params_t p = prm;
          p.pool = dpool[cold ? call++ % kCaches : 0];
          return fp4idx_cuda_score_launch(&p, st);
        });
      }
      const char *chk = "-";
      if (check) {
        std::vector<float> got((size_t)S * R * n);
        TCK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
        if (want.empty()) {
          want.resize((size_t)S * R * n);
          fp4idx_backend_t *cpu = nullptr;
          int rc = fp4idx_backend_cpu_create(&cpu, 0);
          if (!rc) rc = cpu->ops->pool_create(cpu, n_pages, kPage);
          if (!rc) rc = cpu->ops->store(cpu, packed.data(), FP4IDX_DTYPE_FP4, n * S, slots.data(),
                                        FP4IDX_ROUND_RNE);
          std::vector<fp4idx_backend_seq_t> sq(S);
          for (int s = 0; s < S; s++)
            sq[s] = fp4idx_backend_seq_t{perm.data() + s * pages_per_seq, n, R, n,
                                         q.data() + (size_t)s * R * H * 128,
                                         w.data() + (size_t)s * R * H, lens.data() + s * R, nullptr,
                                         0, 0, 0};
          fp4idx_backend_batch_t bt{};
          bt.heads = H;
          bt.n_seqs = S;
          bt.seqs = sq.data();
          bt.logits = want.data();
          if (!rc) rc = cpu->ops->score(cpu, &bt);
          fp4idx_backend_destroy(cpu);
          want_rc = rc;
        }
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); i++) bad += memcmp(&got[i], &want[i], 4) != 0;
        chk = want_rc ? "ERROR" : bad ? "MISMATCH" : "bit-exact";
        printf("check %-18s %s vs CPU backend: %zu of %zu logits differ -> %s\n", c.name, scn, bad,
               got.size(), chk);
      }
      table.push_back(Row{&c, scn, t[0], t[1], floor_us, flop / (t[0] * 1e-6) / 1e12, chk});
      printf("%-18s %s grid %3d hot %8.2f us  cold %8.2f us  floor %6.2f us  x%5.1f floor  %6.1f TFLOP/s"
             "  SGLang %7.1f us (x%.1f faster)\n",
             c.name, scn, prm.grid, t[0], t[1], floor_us, t[0] / floor_us, flop / (t[0] * 1e-6) / 1e12,
             c.sglang_us, c.sglang_us / t[0]);
      fflush(stdout);
      if (cf)
        fprintf(cf, "%s,%d,%d,%d,%lld,%.3f,%.3f,%.3f,%.1f,%.1f,%s\n", c.name, S, R, H, (long long)n,
                t[0], t[1], floor_us, flop / (t[0] * 1e-6) / 1e12, c.sglang_us, scn);
    }
    for (int k = 0; k < kCaches; k++) TCK(cudaFree(dpool[k]));
    TCK(cudaFree(dpages)); TCK(cudaFree(dlens)); TCK(cudaFree(dq)); TCK(cudaFree(dw));
    TCK(cudaFree(dout)); TCK(cudaFree(dseq));
    if (dworks) TCK(cudaFree(dworks));
  }
  if (cf) fclose(cf);
  printf("\n| case | scorer | hot us | cold us | floor us | x floor | TFLOP/s | SGLang us | speedup | check |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto &r : table)
    printf("| %s | %s | %.2f | %.2f | %.2f | %.1f | %.0f | %.1f | %.1fx | %s |\n", r.c->name,
           r.scorer, r.hot, r.cold, r.floor, r.hot / r.floor, r.tf, r.c->sglang_us,
           r.c->sglang_us / r.hot, r.chk);
  return 0;
}
