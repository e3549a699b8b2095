/* fuzz_codec.c -- libFuzzer target for the wire codec (coverage guided; the
 * Criterion test test_protocol_fuzz is the always-on random-mutation one).
 *
 * The input is one frame body, decoded as a request and as a response to
 * every op; whatever decodes must re-encode, and a re-encoded request must
 * decode again. Also fed, with a header, through the frame reader.
 *
 * Build and run (clang): tests/fuzz/run.sh [SECONDS] -- the codec is
 * compiled with -fsanitize=fuzzer-no-link (tests/protocol.cmake), so
 * coverage follows the decoder's branches. Every build also replays the
 * corpus and tests/fuzz/regressions through this function once
 * (fuzz_codec_replay, tests/fuzz/replay_main.c).
 */
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char msg[256];
  fp4idx_request_t r;

  if (fp4idx_decode_request(data, size, &r, msg, sizeof(msg)) == 0) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (fp4idx_encode_request(&sb, &r) != 0) abort();
    fp4idx_request_t r2;
    if (fp4idx_decode_request(sb.data + 4, sb.size - 4, &r2, msg, 256) != 0)
      abort();
    if (r2.id != r.id || r2.op != r.op) abort();
    if (r.op == FP4IDX_OP_SCORE)
      for (size_t i = 0; i < r.u.score.nseqs; i++) {
        uint64_t w;
        (void)fp4idx_score_seq_check(&r.u.score.seqs[i], size, &w, msg, 256);
      }
    fp4idx_request_clear(&r2);
    msgpack_sbuffer_destroy(&sb);
  }
  fp4idx_request_clear(&r);

  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    fp4idx_response_t s;
    if (fp4idx_decode_response(data, size, (fp4idx_op_t)op, &s, msg, 256) == 0) {
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      int rc = s.status == 0 ? fp4idx_encode_response(&sb, &s)
                             : fp4idx_encode_error(&sb, s.id, s.status, s.error);
      if (rc != 0) abort();
      msgpack_sbuffer_destroy(&sb);
    }
    fp4idx_response_clear(&s);
  }

  /* the same bytes as a stream through a small reader, in 7-byte pieces */
  fp4idx_frame_reader_t fr;
  fp4idx_frame_reader_init(&fr, 1024);
  for (size_t off = 0; off < size;) {
    size_t used, n = size - off < 7 ? size - off : 7;
    int rc = fp4idx_frame_reader_feed(&fr, data + off, n, &used);
    if (rc < 0) break;
    off += used;
    if (rc == 1) {
      unsigned char *b;
      size_t bl;
      if (fp4idx_frame_reader_take(&fr, &b, &bl) != 0) abort();
      free(b);
    }
  }
  fp4idx_frame_reader_free(&fr);
  return 0;
}
