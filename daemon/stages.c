/* stages.c -- per-stage latency histograms (see stages.h). */
#define _GNU_SOURCE
#include "stages.h"

#include <string.h>

#include "fp4idx_status.h"

static const char *const fp4idx__stage_names[FP4IDX_STAGE__COUNT] = {
#define FP4IDX__STAGE_NAME(e, name, in_latency) name,
    FP4IDX_STAGE_MAP(FP4IDX__STAGE_NAME)
#undef FP4IDX__STAGE_NAME
};

static const int fp4idx__stage_lat[FP4IDX_STAGE__COUNT] = {
#define FP4IDX__STAGE_LAT(e, name, in_latency) in_latency,
    FP4IDX_STAGE_MAP(FP4IDX__STAGE_LAT)
#undef FP4IDX__STAGE_LAT
};

const char *fp4idx__stage_name(fp4idx_stage_t s) {
  return (int)s >= 0 && s < FP4IDX_STAGE__COUNT ? fp4idx__stage_names[s] : "?";
}

int fp4idx__stage_in_latency(fp4idx_stage_t s) {
  return (int)s >= 0 && s < FP4IDX_STAGE__COUNT && fp4idx__stage_lat[s];
}

uint32_t fp4idx__stages_latency_mask(void) {
  uint32_t m = 0;
  for (int i = 0; i < FP4IDX_STAGE__COUNT; i++)
    if (fp4idx__stage_lat[i]) m |= 1u << i;
  return m;
}

int fp4idx__stages_init(fp4idx_stages_t *s) {
  memset(s, 0, sizeof *s);
  return pthread_mutex_init(&s->mu, NULL) ? FP4IDX_ENOMEM : FP4IDX_OK;
}

void fp4idx__stages_destroy(fp4idx_stages_t *s) { pthread_mutex_destroy(&s->mu); }

static void fp4idx__stage_put(fp4idx_stage_hist_t *h, double us) {
  if (!(us > 0)) us = 0; /* also NaN */
  h->count++;
  h->hist[fp4idx__stats_bucket(us)]++;
  h->sum_us += us;
}

void fp4idx__stages_record(fp4idx_stages_t *s, const fp4idx_stage_times_t *t,
                           uint32_t mask) {
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < FP4IDX_STAGE__COUNT; i++)
    if (mask & (1u << i)) fp4idx__stage_put(&s->st[i], t->us[i]);
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stages_add(fp4idx_stages_t *s, fp4idx_stage_t stage, double us) {
  if ((int)stage < 0 || stage >= FP4IDX_STAGE__COUNT) return;
  pthread_mutex_lock(&s->mu);
  fp4idx__stage_put(&s->st[stage], us);
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stages_snapshot(fp4idx_stages_t *s, fp4idx_stage_hist_t *out) {
  pthread_mutex_lock(&s->mu);
  memcpy(out, s->st, sizeof s->st);
  pthread_mutex_unlock(&s->mu);
}
