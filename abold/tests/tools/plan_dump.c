/*
 * plan_dump.c - prints the planner's answer (status, message, and every field of the plan) for a
 * fixed grid of about 1.4 million calls: two devices (H200, A100), both dtypes, 24 head dims, 17
 * query and 11 key lengths, 5 head groupings, 4 masks and all 4 backends. A refactor of the planner
 * must leave this output byte for byte the same:
 *
 *     scripts/plan_dump.sh build | sha256sum       (before and after; the hashes must match)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Planning never dispatches; the launchers are not linked. */
flashattn_status fa_dispatch(const flashattn_handle *h, const fa_plan *plan, void *workspace, void *stream) {
    (void)h, (void)plan, (void)workspace, (void)stream;
    abort();
}

int main(void) {
    static const fa_device_caps devices[] = {{0, 9, 0, 132, 232448}, {0, 8, 0, 108, 166912}};
    static const int64_t head_dims[] = {1, 8, 16, 24, 32, 36, 40, 48, 56, 59, 64, 72,
                                        80, 96, 112, 120, 128, 136, 160, 176, 192, 200, 224, 256};
    static const int64_t sqs[] = {0, 1, 2, 4, 16, 63, 64, 65, 127, 128, 129, 192, 255, 256, 513, 1024, 2048};
    static const int64_t sks[] = {0, 1, 64, 127, 128, 129, 1024, 4096, 8192, 32768, 131072};
    static const int64_t groups[][2] = {{1, 1}, {8, 8}, {32, 8}, {32, 4}, {16, 1}};
    static char line[1024];
    setvbuf(stdout, NULL, _IOFBF, 1 << 20);
    for (size_t dv = 0; dv < sizeof devices / sizeof devices[0]; ++dv)
        for (int dt = 0; dt < 2; ++dt)
            for (size_t hd = 0; hd < sizeof head_dims / sizeof head_dims[0]; ++hd)
                for (size_t iq = 0; iq < sizeof sqs / sizeof sqs[0]; ++iq)
                    for (size_t ik = 0; ik < sizeof sks / sizeof sks[0]; ++ik)
                        for (size_t gr = 0; gr < sizeof groups / sizeof groups[0]; ++gr)
                            for (int mask = 0; mask < 4; ++mask)
                                for (int be = 0; be < 4; ++be) {
                                    flashattn_fwd_params p;
                                    flashattn_fwd_params_init(&p);
                                    p.dtype = dt, p.backend = be, p.batch = 2;
                                    p.seqlen_q = sqs[iq], p.seqlen_k = sks[ik];
                                    p.heads_q = groups[gr][0], p.heads_kv = groups[gr][1], p.head_dim = head_dims[hd];
                                    flashattn_fwd_params_set_packed_strides(&p);
                                    p.q = (const void *)0x100000, p.k = (const void *)0x200000;
                                    p.v = (const void *)0x300000, p.o = (void *)0x400000, p.lse = (float *)0x500000;
                                    if (mask == 3) p.window_left = 64, p.window_right = 0;
                                    else p.mask = mask;
                                    fa_plan plan;
                                    memset(&plan, 0, sizeof plan);
                                    const flashattn_status st = fa_plan_make(&devices[dv], &p, 0, &plan);
                                    if (st != FLASHATTN_STATUS_SUCCESS) {
                                        printf("%d %s\n", (int)st, flashattn_last_error());
                                        continue;
                                    }
                                    flashattn_plan_info info;
                                    flashattn_plan_info_init(&info);
                                    fa_plan_describe(&plan, &info);
                                    const fa_kernel_params *k = &plan.kp;
                                    snprintf(line, sizeof line,
                                             "0 %s | cfg %d %d %d %d | noop %d | kp %d %d %d %d %d %d %d %d %d %d %d "
                                             "%a %a %a %a | ws %lld %lld %lld %lld %lld %lld %lld %lld",
                                             info.description, plan.cfg.head_dim, plan.cfg.block_m, plan.cfg.block_n,
                                             plan.cfg.warps, plan.noop, k->batch, k->seqlen_q, k->seqlen_k, k->heads_q,
                                             k->heads_kv, k->head_group, k->key_lo_off, k->key_hi_off, k->num_m_blocks,
                                             k->pack_gqa, k->pack_rows, (double)k->scale, (double)k->scale_log2,
                                             (double)k->softcap, (double)k->softcap_inv_scale,
                                             (long long)plan.o_accum_off, (long long)plan.lse_accum_off,
                                             (long long)plan.ref.ptr_arrays, (long long)plan.ref.scores,
                                             (long long)plan.ref.v_f32, (long long)plan.ref.o_f32,
                                             (long long)plan.ref.cublas_ws, (long long)plan.ref.total);
                                    puts(line);
                                }
    return 0;
}
