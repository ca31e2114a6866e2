// test_host.cpp - tests that need no GPU: status codes and strings, version, the frozen ABI layout,
// the validation table (every bad input -> its own status and a message naming the field), and the
// planner's decisions for synthetic devices. Runs everywhere, CI included.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

extern "C" {
#include "flashattn.h"
#include "internal.h"
}

namespace {

// ---- status codes, strings, version ------------------------------------------------------------

TEST(Status, EveryCodeHasANameAndASentence) {
    const char *names[] = {"SUCCESS", "NULL_POINTER", "MISALIGNED_POINTER", "BAD_STRUCT_SIZE",
                           "BAD_SHAPE", "BAD_STRIDE", "INDEX_OVERFLOW", "BAD_HEAD_GROUPING",
                           "UNSUPPORTED_HEAD_DIM", "BAD_DTYPE", "BAD_SCALE", "BAD_MASK", "BAD_WINDOW",
                           "BAD_SOFTCAP", "BAD_BACKEND", "UNSUPPORTED", "WORKSPACE_TOO_SMALL",
                           "DEVICE_TOO_OLD", "WRONG_DEVICE", "NO_DEVICE", "CUDA_ERROR",
                           "CUBLAS_ERROR", "OUT_OF_HOST_MEMORY", "BAD_LSE_BASE", "BAD_VARLEN",
                           "BAD_PAGED_KV", "BAD_APPEND", "BAD_ROTARY"};
    for (int s = 0; s < (int)(sizeof names / sizeof names[0]); ++s) {
        EXPECT_EQ(std::string("FLASHATTN_STATUS_") + names[s],
                  flashattn_status_name((flashattn_status)s));
        const std::string sentence = flashattn_status_string((flashattn_status)s);
        EXPECT_GT(sentence.size(), 8u) << names[s];
        EXPECT_EQ(sentence.back(), '.') << names[s];
    }
    EXPECT_STREQ("FLASHATTN_STATUS_UNKNOWN", flashattn_status_name((flashattn_status)28));
    EXPECT_STREQ("FLASHATTN_STATUS_UNKNOWN", flashattn_status_name((flashattn_status)-1));
    EXPECT_NE(nullptr, flashattn_status_string((flashattn_status)1000));
}

TEST(Status, ValuesAreFrozen) {
    EXPECT_EQ(0, FLASHATTN_STATUS_SUCCESS);
    EXPECT_EQ(4, FLASHATTN_STATUS_BAD_SHAPE);
    EXPECT_EQ(15, FLASHATTN_STATUS_UNSUPPORTED);
    EXPECT_EQ(16, FLASHATTN_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_EQ(19, FLASHATTN_STATUS_NO_DEVICE);
    EXPECT_EQ(22, FLASHATTN_STATUS_OUT_OF_HOST_MEMORY);
    EXPECT_EQ(23, FLASHATTN_STATUS_BAD_LSE_BASE);
    EXPECT_EQ(24, FLASHATTN_STATUS_BAD_VARLEN);
    EXPECT_EQ(25, FLASHATTN_STATUS_BAD_PAGED_KV);
    EXPECT_EQ(26, FLASHATTN_STATUS_BAD_APPEND);
    EXPECT_EQ(27, FLASHATTN_STATUS_BAD_ROTARY);
    EXPECT_EQ(2, FLASHATTN_DTYPE_FLOAT32);
}

TEST(Version, MatchesHeader) {
    EXPECT_EQ(FLASHATTN_VERSION, flashattn_version());
    const std::string v = std::to_string(FLASHATTN_VERSION_MAJOR) + "." +
                          std::to_string(FLASHATTN_VERSION_MINOR) + "." +
                          std::to_string(FLASHATTN_VERSION_PATCH);
    EXPECT_EQ(v, flashattn_version_string());
}

// ---- ABI layout: appending is the only allowed change -------------------------------------------

TEST(Abi, ParamsLayoutIsFrozen) {
    EXPECT_EQ(0u, offsetof(flashattn_fwd_params, struct_size));
    EXPECT_EQ(8u, offsetof(flashattn_fwd_params, dtype));
    EXPECT_EQ(12u, offsetof(flashattn_fwd_params, mask));
    EXPECT_EQ(16u, offsetof(flashattn_fwd_params, backend));
    EXPECT_EQ(20u, offsetof(flashattn_fwd_params, reserved0));
    EXPECT_EQ(24u, offsetof(flashattn_fwd_params, batch));
    EXPECT_EQ(64u, offsetof(flashattn_fwd_params, head_dim));
    EXPECT_EQ(72u, offsetof(flashattn_fwd_params, q));
    EXPECT_EQ(104u, offsetof(flashattn_fwd_params, k));
    EXPECT_EQ(136u, offsetof(flashattn_fwd_params, v));
    EXPECT_EQ(168u, offsetof(flashattn_fwd_params, o));
    EXPECT_EQ(200u, offsetof(flashattn_fwd_params, lse));
    EXPECT_EQ(208u, offsetof(flashattn_fwd_params, softmax_scale));
    EXPECT_EQ(212u, offsetof(flashattn_fwd_params, softcap));
    EXPECT_EQ(216u, offsetof(flashattn_fwd_params, window_left));
    EXPECT_EQ(224u, offsetof(flashattn_fwd_params, window_right));
    EXPECT_EQ(232u, offsetof(flashattn_fwd_params, alibi_slopes));
    EXPECT_EQ(240u, offsetof(flashattn_fwd_params, alibi_batch_stride));
    // 0.3.0's serving fields, appended after the 0.1.0 layout.
    EXPECT_EQ(248u, offsetof(flashattn_fwd_params, cu_seqlens_q));
    EXPECT_EQ(256u, offsetof(flashattn_fwd_params, cu_seqlens_k));
    EXPECT_EQ(264u, offsetof(flashattn_fwd_params, seqused_k));
    EXPECT_EQ(272u, offsetof(flashattn_fwd_params, total_q));
    EXPECT_EQ(280u, offsetof(flashattn_fwd_params, total_k));
    EXPECT_EQ(288u, offsetof(flashattn_fwd_params, block_table));
    EXPECT_EQ(296u, offsetof(flashattn_fwd_params, block_table_batch_stride));
    EXPECT_EQ(304u, offsetof(flashattn_fwd_params, pages_per_seq));
    EXPECT_EQ(312u, offsetof(flashattn_fwd_params, page_size));
    EXPECT_EQ(320u, offsetof(flashattn_fwd_params, num_pages));
    EXPECT_EQ(328u, offsetof(flashattn_fwd_params, kv_batch_idx));
    EXPECT_EQ(336u, offsetof(flashattn_fwd_params, kv_batch));
    EXPECT_EQ(344u, offsetof(flashattn_fwd_params, k_new));
    EXPECT_EQ(352u, offsetof(flashattn_fwd_params, k_new_batch_stride));
    EXPECT_EQ(376u, offsetof(flashattn_fwd_params, v_new));
    EXPECT_EQ(384u, offsetof(flashattn_fwd_params, v_new_batch_stride));
    EXPECT_EQ(408u, offsetof(flashattn_fwd_params, seqlen_new));
    EXPECT_EQ(416u, offsetof(flashattn_fwd_params, rotary_cos));
    EXPECT_EQ(424u, offsetof(flashattn_fwd_params, rotary_sin));
    EXPECT_EQ(432u, offsetof(flashattn_fwd_params, rotary_dim));
    EXPECT_EQ(440u, offsetof(flashattn_fwd_params, seqlen_ro));
    EXPECT_EQ(448u, offsetof(flashattn_fwd_params, rotary_interleaved));
    EXPECT_EQ(452u, offsetof(flashattn_fwd_params, rotary_q_at_cache_len));
    EXPECT_EQ(456u, offsetof(flashattn_fwd_params, reserved1));
    EXPECT_EQ(464u, offsetof(flashattn_fwd_params, kv_indptr));
    EXPECT_EQ(472u, offsetof(flashattn_fwd_params, kv_last_page_len));
    EXPECT_EQ(480u, offsetof(flashattn_fwd_params, num_page_indices));
    EXPECT_EQ(488u, (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_3);
    // 0.4.0's field, appended after the 0.3.0 layout.
    EXPECT_EQ(488u, offsetof(flashattn_fwd_params, cache_leftpad));
    EXPECT_EQ(496u, sizeof(flashattn_fwd_params));
    EXPECT_EQ((size_t)FLASHATTN_FWD_PARAMS_SIZE_0_4, sizeof(flashattn_fwd_params));
}

TEST(Abi, PlanInfoLayoutIsFrozen) {
    EXPECT_EQ(0u, offsetof(flashattn_plan_info, struct_size));
    EXPECT_EQ(8u, offsetof(flashattn_plan_info, backend));
    EXPECT_EQ(48u, offsetof(flashattn_plan_info, workspace_bytes));
    EXPECT_EQ(56u, offsetof(flashattn_plan_info, shared_mem_bytes));
    EXPECT_EQ(64u, offsetof(flashattn_plan_info, kernel_name));
    EXPECT_EQ(128u, offsetof(flashattn_plan_info, description));
    EXPECT_EQ(320u, sizeof(flashattn_plan_info));
}

TEST(Params, InitSetsDefaults) {
    flashattn_fwd_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_init(&p));
    EXPECT_EQ(sizeof p, p.struct_size);
    EXPECT_EQ(FLASHATTN_BACKEND_AUTO, p.backend);
    EXPECT_EQ(FLASHATTN_MASK_NONE, p.mask);
    EXPECT_EQ(-1, p.window_left);
    EXPECT_EQ(-1, p.window_right);
    EXPECT_EQ(0.0f, p.softmax_scale);
    EXPECT_EQ(0.0f, p.softcap);
    EXPECT_EQ(nullptr, p.q);
    EXPECT_EQ(nullptr, p.alibi_slopes);
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd_params_init_size(nullptr, sizeof p));
    EXPECT_NE(std::string(flashattn_last_error()).find("params"), std::string::npos);
}

TEST(Params, PackedStridesRefuseOverflowAndNegativeShapes) {
    flashattn_fwd_params p;
    flashattn_fwd_params_init(&p);
    p.batch = 1, p.seqlen_q = 2, p.seqlen_k = 2, p.heads_q = (int64_t)1 << 62, p.heads_kv = 1, p.head_dim = 2;
    p.q_seq_stride = 77;
    EXPECT_EQ(FLASHATTN_STATUS_INDEX_OVERFLOW, flashattn_fwd_params_set_packed_strides(&p));
    EXPECT_NE(std::string(flashattn_last_error()).find("heads_q"), std::string::npos) << flashattn_last_error();
    EXPECT_EQ(77, p.q_seq_stride);  // untouched on failure
    p.heads_q = 1, p.heads_kv = 2, p.seqlen_k = INT64_MAX / 2;
    EXPECT_EQ(FLASHATTN_STATUS_INDEX_OVERFLOW, flashattn_fwd_params_set_packed_strides(&p));
    EXPECT_NE(std::string(flashattn_last_error()).find("seqlen_k"), std::string::npos) << flashattn_last_error();
    EXPECT_EQ(77, p.q_seq_stride);
    p.seqlen_k = 2, p.head_dim = -8;
    EXPECT_EQ(FLASHATTN_STATUS_BAD_SHAPE, flashattn_fwd_params_set_packed_strides(&p));
    EXPECT_NE(std::string(flashattn_last_error()).find("head_dim"), std::string::npos) << flashattn_last_error();
    EXPECT_EQ(77, p.q_seq_stride);
    p.struct_size = 12;
    EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE, flashattn_fwd_params_set_packed_strides(&p));
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd_params_set_packed_strides(nullptr));
}

TEST(Params, PackedStrides) {
    flashattn_fwd_params p;
    flashattn_fwd_params_init(&p);
    p.batch = 2, p.seqlen_q = 5, p.seqlen_k = 7, p.heads_q = 8, p.heads_kv = 2, p.head_dim = 64;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_set_packed_strides(&p));
    EXPECT_EQ(64, p.q_head_stride);
    EXPECT_EQ(8 * 64, p.q_seq_stride);
    EXPECT_EQ(5 * 8 * 64, p.q_batch_stride);
    EXPECT_EQ(2 * 64, p.k_seq_stride);
    EXPECT_EQ(7 * 2 * 64, p.v_batch_stride);
    EXPECT_EQ(p.q_seq_stride, p.o_seq_stride);
}

// ---- validation table ----------------------------------------------------------------------------

// Fake, well-aligned device addresses: validation and planning never dereference them.
flashattn_fwd_params valid_params() {
    flashattn_fwd_params p;
    flashattn_fwd_params_init(&p);
    p.dtype = FLASHATTN_DTYPE_BFLOAT16;
    p.batch = 2, p.seqlen_q = 100, p.seqlen_k = 200, p.heads_q = 8, p.heads_kv = 2, p.head_dim = 128;
    flashattn_fwd_params_set_packed_strides(&p);
    p.q = (const void *)0x100000, p.k = (const void *)0x200000, p.v = (const void *)0x300000;
    p.o = (void *)0x400000;
    return p;
}

// ---- serving calls (0.3.0): ragged, paged and indexed K/V ------------------------------------------

// Valid serving params on fake addresses: 3 sequences packed in 300 query rows, K/V in 64 pages of
// 16 keys (the pools' page stride in the batch strides), a block table with a wider row stride.
flashattn_fwd_params valid_varlen_paged() {
    flashattn_fwd_params p = valid_params();
    p.batch = 3, p.seqlen_q = 100, p.seqlen_k = 200;
    p.cu_seqlens_q = (const int32_t *)0x700000, p.total_q = 300;
    p.q_batch_stride = p.o_batch_stride = 0;
    p.seqused_k = (const int32_t *)0x710000;
    p.block_table = (const int32_t *)0x720000, p.pages_per_seq = 13, p.block_table_batch_stride = 16;
    p.page_size = 16, p.num_pages = 64;
    p.k_batch_stride = p.v_batch_stride = 16 * p.k_seq_stride;
    return p;
}

// Ragged K/V (packed, no pages) and an indexed dense cache.
flashattn_fwd_params valid_varlen_packed() {
    flashattn_fwd_params p = valid_params();
    p.cu_seqlens_q = (const int32_t *)0x700000, p.total_q = 150;
    p.cu_seqlens_k = (const int32_t *)0x708000, p.total_k = 350;
    p.q_batch_stride = p.o_batch_stride = p.k_batch_stride = p.v_batch_stride = 0;
    return p;
}

// FlashInfer's page lists: 3 sequences' pages in one list of 40 entries.
flashattn_fwd_params valid_page_lists() {
    flashattn_fwd_params p = valid_varlen_paged();
    p.seqused_k = nullptr, p.block_table_batch_stride = 0;
    p.kv_indptr = (const int32_t *)0x780000, p.kv_last_page_len = (const int32_t *)0x790000, p.num_page_indices = 40;
    return p;
}

flashattn_fwd_params valid_indexed_cache() {
    flashattn_fwd_params p = valid_params();
    p.kv_batch_idx = (const int32_t *)0x730000, p.kv_batch = 5;
    p.seqused_k = (const int32_t *)0x710000;
    return p;
}

// Decode with append and rotary over the paged cache: 2 new keys per sequence, GPT-J tables.
flashattn_fwd_params valid_append() {
    flashattn_fwd_params p = valid_varlen_paged();
    p.cu_seqlens_q = nullptr, p.total_q = 0;
    p.seqlen_q = 2, p.q_seq_stride = p.o_seq_stride = 8 * 128, p.q_batch_stride = p.o_batch_stride = 2 * 8 * 128;
    p.k_new = (const void *)0x740000, p.v_new = (const void *)0x750000, p.seqlen_new = 2;
    p.k_new_head_stride = p.v_new_head_stride = 128, p.k_new_seq_stride = p.v_new_seq_stride = 2 * 128;
    p.k_new_batch_stride = p.v_new_batch_stride = 2 * 2 * 128;
    p.rotary_cos = (const void *)0x760000, p.rotary_sin = (const void *)0x770000;
    p.rotary_dim = 64, p.seqlen_ro = 4096, p.rotary_interleaved = 1;
    return p;
}

fa_device_caps h200_caps() { return fa_device_caps{0, 9, 0, 132, 232448}; }
fa_device_caps a100_caps() { return fa_device_caps{0, 8, 0, 108, 166912}; }

struct BadCase {
    const char *what;
    std::function<void(flashattn_fwd_params &)> mutate;
    flashattn_status expected;
    const char *message_mentions;
    flashattn_fwd_params (*base)() = valid_params;  // the valid params the mutation starts from
};

const std::vector<BadCase> &bad_cases() {
    static const std::vector<BadCase> cases = {
        {"struct_size too small", [](auto &p) { p.struct_size = 8; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE, "struct_size"},
        {"struct_size too large", [](auto &p) { p.struct_size += 8; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE, "struct_size"},
        {"reserved0 set", [](auto &p) { p.reserved0 = 1; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE, "reserved0"},
        {"dtype unknown", [](auto &p) { p.dtype = 7; }, FLASHATTN_STATUS_BAD_DTYPE, "dtype"},
        {"dtype negative", [](auto &p) { p.dtype = -1; }, FLASHATTN_STATUS_BAD_DTYPE, "dtype"},
        {"mask unknown", [](auto &p) { p.mask = 3; }, FLASHATTN_STATUS_BAD_MASK, "mask"},
        {"backend unknown", [](auto &p) { p.backend = 9; }, FLASHATTN_STATUS_BAD_BACKEND, "backend"},
        {"batch zero", [](auto &p) { p.batch = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "batch"},
        {"batch negative", [](auto &p) { p.batch = -3; }, FLASHATTN_STATUS_BAD_SHAPE, "batch"},
        {"batch > int32", [](auto &p) { p.batch = (int64_t)1 << 31; }, FLASHATTN_STATUS_BAD_SHAPE, "batch"},
        {"seqlen_q negative", [](auto &p) { p.seqlen_q = -1; }, FLASHATTN_STATUS_BAD_SHAPE, "seqlen_q"},
        {"seqlen_k negative", [](auto &p) { p.seqlen_k = -1; }, FLASHATTN_STATUS_BAD_SHAPE, "seqlen_k"},
        {"seqlen_q too long", [](auto &p) { p.seqlen_q = ((int64_t)1 << 30) + 1; }, FLASHATTN_STATUS_BAD_SHAPE, "seqlen_q"},
        {"seqlen_k too long", [](auto &p) { p.seqlen_k = (int64_t)1 << 40; }, FLASHATTN_STATUS_BAD_SHAPE, "seqlen_k"},
        {"heads_q zero", [](auto &p) { p.heads_q = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "heads_q"},
        {"heads_kv zero", [](auto &p) { p.heads_kv = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "heads_kv"},
        {"head_dim zero", [](auto &p) { p.head_dim = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "head_dim"},
        {"head_dim negative", [](auto &p) { p.head_dim = -64; }, FLASHATTN_STATUS_BAD_SHAPE, "head_dim"},
        {"heads_q not a multiple of heads_kv", [](auto &p) { p.heads_q = 7; p.heads_kv = 2; }, FLASHATTN_STATUS_BAD_HEAD_GROUPING, "heads_kv"},
        {"heads_kv > heads_q", [](auto &p) { p.heads_q = 2; p.heads_kv = 8; }, FLASHATTN_STATUS_BAD_HEAD_GROUPING, "heads_q"},
        {"head_dim 257", [](auto &p) { p.head_dim = 257; }, FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM, "head_dim"},
        {"head_dim 512", [](auto &p) { p.head_dim = 512; }, FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM, "256"},
        {"q NULL", [](auto &p) { p.q = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "q"},
        {"k NULL", [](auto &p) { p.k = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "k"},
        {"v NULL", [](auto &p) { p.v = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "v"},
        {"o NULL", [](auto &p) { p.o = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "o"},
        {"q odd address", [](auto &p) { p.q = (const char *)p.q + 1; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "q"},
        {"o odd address", [](auto &p) { p.o = (char *)p.o + 3; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "o"},
        {"lse misaligned", [](auto &p) { p.lse = (float *)0x500002; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "lse"},
        {"alibi misaligned", [](auto &p) { p.alibi_slopes = (const float *)0x600001; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "alibi_slopes"},
        {"q stride negative", [](auto &p) { p.q_seq_stride = -128; }, FLASHATTN_STATUS_BAD_STRIDE, "q_seq_stride"},
        {"k batch stride negative", [](auto &p) { p.k_batch_stride = -1; }, FLASHATTN_STATUS_BAD_STRIDE, "k_batch_stride"},
        {"v head stride negative", [](auto &p) { p.v_head_stride = -1; }, FLASHATTN_STATUS_BAD_STRIDE, "v_head_stride"},
        {"o strides overlap", [](auto &p) { p.o_head_stride = 64; }, FLASHATTN_STATUS_BAD_STRIDE, "o strides"},
        {"o broadcast over batch", [](auto &p) { p.o_batch_stride = 0; }, FLASHATTN_STATUS_BAD_STRIDE, "o strides"},
        {"alibi batch stride negative", [](auto &p) { p.alibi_batch_stride = -8; }, FLASHATTN_STATUS_BAD_STRIDE, "alibi_batch_stride"},
        {"alibi batch stride < heads", [](auto &p) { p.alibi_batch_stride = 3; }, FLASHATTN_STATUS_BAD_STRIDE, "alibi_batch_stride"},
        {"q extent x stride overflow", [](auto &p) { p.q_batch_stride = INT64_MAX / 2; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "q"},
        {"k byte offset overflow", [](auto &p) { p.k_seq_stride = INT64_MAX / 300; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "k"},
        // v's last element at offset INT64_MAX / 2: its offset fits, its end in bytes does not.
        {"v end one byte past int64", [](auto &p) { p.v_batch_stride = INT64_MAX / 2 - (199 * 256 + 128 + 127); },
         FLASHATTN_STATUS_INDEX_OVERFLOW, "v:"},
        {"scale negative", [](auto &p) { p.softmax_scale = -0.125f; }, FLASHATTN_STATUS_BAD_SCALE, "softmax_scale"},
        {"scale NaN", [](auto &p) { p.softmax_scale = NAN; }, FLASHATTN_STATUS_BAD_SCALE, "softmax_scale"},
        {"scale inf", [](auto &p) { p.softmax_scale = INFINITY; }, FLASHATTN_STATUS_BAD_SCALE, "softmax_scale"},
        {"softcap negative", [](auto &p) { p.softcap = -30.0f; }, FLASHATTN_STATUS_BAD_SOFTCAP, "softcap"},
        {"softcap NaN", [](auto &p) { p.softcap = NAN; }, FLASHATTN_STATUS_BAD_SOFTCAP, "softcap"},
        {"softcap inf", [](auto &p) { p.softcap = INFINITY; }, FLASHATTN_STATUS_BAD_SOFTCAP, "softcap"},
        {"window_left -2", [](auto &p) { p.window_left = -2; }, FLASHATTN_STATUS_BAD_WINDOW, "window_left"},
        {"window_right -5", [](auto &p) { p.window_right = -5; }, FLASHATTN_STATUS_BAD_WINDOW, "window_right"},
        // Found by fuzzing: each once reached the kernels.
        {"alibi extent overflows int64 bytes", [](auto &p) { p.alibi_slopes = (const float *)0x600000; p.alibi_batch_stride = INT64_MAX / 4; },
         FLASHATTN_STATUS_INDEX_OVERFLOW, "alibi_batch_stride"},
        {"alibi extent just past int64 bytes", [](auto &p) { p.alibi_slopes = (const float *)0x600000; p.alibi_batch_stride = INT64_MAX / 4 - 4; },
         FLASHATTN_STATUS_INDEX_OVERFLOW, "alibi_slopes"},
        {"scale x log2(e) overflows float", [](auto &p) { p.softmax_scale = 3.0e38f; }, FLASHATTN_STATUS_BAD_SCALE, "softmax_scale"},
        {"scale / softcap overflows float", [](auto &p) { p.softmax_scale = 1.0f; p.softcap = 2e-39f; }, FLASHATTN_STATUS_BAD_SOFTCAP, "softcap"},
        {"softcap x log2(e) overflows float", [](auto &p) { p.softcap = 3.0e38f; }, FLASHATTN_STATUS_BAD_SOFTCAP, "softcap"},
        {"lse extent overflows int64 bytes", [](auto &p) {
             // O is [B, 1, H, 1] dense (its bytes fit int64); LSE's 4-byte elements do not.
             p.batch = INT32_MAX, p.heads_q = INT32_MAX, p.heads_kv = 1, p.seqlen_q = 1, p.seqlen_k = 1, p.head_dim = 1;
             p.q_batch_stride = p.q_seq_stride = p.q_head_stride = 0;
             p.k_batch_stride = p.k_seq_stride = p.k_head_stride = 0;
             p.v_batch_stride = p.v_seq_stride = p.v_head_stride = 0;
             p.o_head_stride = 1, p.o_seq_stride = INT32_MAX, p.o_batch_stride = INT32_MAX;
             p.lse = (float *)0x500000; },
         FLASHATTN_STATUS_INDEX_OVERFLOW, "lse"},
        // The serving fields (0.3.0), from valid serving params.
        {"cu_seqlens_q misaligned", [](auto &p) { p.cu_seqlens_q = (const int32_t *)0x700002; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "cu_seqlens_q", valid_varlen_paged},
        {"block_table misaligned", [](auto &p) { p.block_table = (const int32_t *)0x720001; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "block_table", valid_varlen_paged},
        {"kv_batch_idx misaligned", [](auto &p) { p.kv_batch_idx = (const int32_t *)0x730003; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "kv_batch_idx", valid_indexed_cache},
        {"total_q without cu_seqlens_q", [](auto &p) { p.total_q = 10; }, FLASHATTN_STATUS_BAD_VARLEN, "total_q", valid_params},
        {"total_k without cu_seqlens_k", [](auto &p) { p.total_k = 10; }, FLASHATTN_STATUS_BAD_VARLEN, "total_k", valid_params},
        {"total_k with paged K/V", [](auto &p) { p.cu_seqlens_k = (const int32_t *)0x708000; p.total_k = 10; }, FLASHATTN_STATUS_BAD_VARLEN, "paged", valid_varlen_paged},
        {"total_q negative", [](auto &p) { p.total_q = -1; }, FLASHATTN_STATUS_BAD_SHAPE, "total_q", valid_varlen_paged},
        {"total_k above int32", [](auto &p) { p.total_k = (int64_t)1 << 31; }, FLASHATTN_STATUS_BAD_SHAPE, "total_k", valid_varlen_packed},
        {"packed q with a batch stride", [](auto &p) { p.q_batch_stride = 1024; }, FLASHATTN_STATUS_BAD_VARLEN, "q_batch_stride", valid_varlen_paged},
        {"packed o with a batch stride", [](auto &p) { p.o_batch_stride = 1024; }, FLASHATTN_STATUS_BAD_VARLEN, "o_batch_stride", valid_varlen_paged},
        {"packed k with a batch stride", [](auto &p) { p.k_batch_stride = 1024; }, FLASHATTN_STATUS_BAD_VARLEN, "k_batch_stride", valid_varlen_packed},
        {"kv_batch without kv_batch_idx", [](auto &p) { p.kv_batch = 4; }, FLASHATTN_STATUS_BAD_VARLEN, "kv_batch", valid_params},
        {"kv_batch_idx with paged K/V", [](auto &p) { p.kv_batch_idx = (const int32_t *)0x730000; p.kv_batch = 2; }, FLASHATTN_STATUS_BAD_VARLEN, "block_table", valid_varlen_paged},
        {"kv_batch_idx with packed K/V", [](auto &p) { p.kv_batch_idx = (const int32_t *)0x730000; p.kv_batch = 2; }, FLASHATTN_STATUS_BAD_VARLEN, "cu_seqlens_k", valid_varlen_packed},
        {"cache_leftpad misaligned", [](auto &p) { p.cache_leftpad = (const int32_t *)0x740002; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "cache_leftpad", valid_indexed_cache},
        {"cache_leftpad with paged K/V", [](auto &p) { p.cache_leftpad = (const int32_t *)0x740000; }, FLASHATTN_STATUS_BAD_PAGED_KV, "cache_leftpad", valid_varlen_paged},
        {"kv_batch zero", [](auto &p) { p.kv_batch = 0; }, FLASHATTN_STATUS_BAD_VARLEN, "kv_batch", valid_indexed_cache},
        {"page_size without block_table", [](auto &p) { p.page_size = 16; }, FLASHATTN_STATUS_BAD_PAGED_KV, "page_size", valid_params},
        {"num_pages without block_table", [](auto &p) { p.num_pages = 16; }, FLASHATTN_STATUS_BAD_PAGED_KV, "num_pages", valid_params},
        {"page_size zero", [](auto &p) { p.page_size = 0; }, FLASHATTN_STATUS_BAD_PAGED_KV, "page_size", valid_varlen_paged},
        {"num_pages zero", [](auto &p) { p.num_pages = 0; }, FLASHATTN_STATUS_BAD_PAGED_KV, "num_pages", valid_varlen_paged},
        {"pages_per_seq zero", [](auto &p) { p.pages_per_seq = 0; }, FLASHATTN_STATUS_BAD_PAGED_KV, "pages_per_seq", valid_varlen_paged},
        {"block table rows overlap", [](auto &p) { p.block_table_batch_stride = 12; }, FLASHATTN_STATUS_BAD_PAGED_KV, "block_table_batch_stride", valid_varlen_paged},
        {"block table extent overflows", [](auto &p) { p.block_table_batch_stride = INT64_MAX / 2; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "block_table", valid_varlen_paged},
        {"capacity above the table's pages", [](auto &p) { p.seqlen_k = 13 * 16 + 1; }, FLASHATTN_STATUS_BAD_PAGED_KV, "seqlen_k", valid_varlen_paged},
        {"pool extent overflows", [](auto &p) { p.k_batch_stride = INT64_MAX / 32; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "k", valid_varlen_paged},
        {"packed q extent overflows", [](auto &p) { p.q_seq_stride = INT64_MAX / 200; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "q", valid_varlen_paged},
        {"packed o overlaps itself", [](auto &p) { p.o_seq_stride = 64; }, FLASHATTN_STATUS_BAD_STRIDE, "o strides", valid_varlen_packed},
        {"k_new without v_new", [](auto &p) { p.v_new = nullptr; }, FLASHATTN_STATUS_BAD_APPEND, "v_new", valid_append},
        {"v_new without k_new", [](auto &p) { p.k_new = nullptr; p.rotary_cos = p.rotary_sin = nullptr; p.rotary_dim = p.seqlen_ro = 0; }, FLASHATTN_STATUS_BAD_APPEND, "k_new", valid_append},
        {"seqlen_new without k_new", [](auto &p) { p.seqlen_new = 3; }, FLASHATTN_STATUS_BAD_APPEND, "seqlen_new", valid_params},
        {"append without seqused_k", [](auto &p) { p.seqused_k = nullptr; }, FLASHATTN_STATUS_BAD_APPEND, "seqused_k", valid_append},
        {"append to packed K/V", [](auto &p) { p.cu_seqlens_q = nullptr; p.total_q = 0; p.q_batch_stride = p.o_batch_stride = 100 * 8 * 128; p.seqused_k = (const int32_t *)0x710000; p.k_new = p.v_new = (const void *)0x740000; }, FLASHATTN_STATUS_BAD_APPEND, "cu_seqlens_k", valid_varlen_packed},
        {"append with packed Q", [](auto &p) { p.k_new = p.v_new = (const void *)0x740000; }, FLASHATTN_STATUS_BAD_APPEND, "cu_seqlens_q", valid_varlen_paged},
        {"seqlen_new negative", [](auto &p) { p.seqlen_new = -1; }, FLASHATTN_STATUS_BAD_SHAPE, "seqlen_new", valid_append},
        {"k_new misaligned", [](auto &p) { p.k_new = (const void *)0x740001; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "k_new", valid_append},
        {"v_new stride negative", [](auto &p) { p.v_new_seq_stride = -1; }, FLASHATTN_STATUS_BAD_STRIDE, "v_new", valid_append},
        {"k_new extent overflows", [](auto &p) { p.k_new_batch_stride = INT64_MAX / 2; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "k_new", valid_append},
        {"page lists with a row stride", [](auto &p) { p.block_table_batch_stride = 16; }, FLASHATTN_STATUS_BAD_PAGED_KV, "block_table_batch_stride", valid_page_lists},
        {"page lists without block_table", [](auto &p) { p.block_table = nullptr; p.page_size = p.num_pages = p.pages_per_seq = 0; }, FLASHATTN_STATUS_BAD_PAGED_KV, "block_table", valid_page_lists},
        {"page lists without entries", [](auto &p) { p.num_page_indices = 0; }, FLASHATTN_STATUS_BAD_PAGED_KV, "num_page_indices", valid_page_lists},
        {"last page lengths without kv_indptr", [](auto &p) { p.kv_last_page_len = (const int32_t *)0x790000; }, FLASHATTN_STATUS_BAD_PAGED_KV, "kv_last_page_len", valid_varlen_paged},
        {"num_page_indices without kv_indptr", [](auto &p) { p.num_page_indices = 9; }, FLASHATTN_STATUS_BAD_PAGED_KV, "num_page_indices", valid_varlen_paged},
        {"kv_indptr misaligned", [](auto &p) { p.kv_indptr = (const int32_t *)0x780002; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "kv_indptr", valid_page_lists},
        {"reserved1 set", [](auto &p) { p.reserved1 = 1; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE, "reserved1", valid_page_lists},
        {"cos without sin", [](auto &p) { p.rotary_sin = nullptr; }, FLASHATTN_STATUS_BAD_ROTARY, "rotary_sin", valid_append},
        {"rotary without k_new", [](auto &p) { p.rotary_cos = p.rotary_sin = (const void *)0x760000; p.rotary_dim = 64; p.seqlen_ro = 10; }, FLASHATTN_STATUS_BAD_ROTARY, "k_new", valid_indexed_cache},
        {"rotary_dim odd", [](auto &p) { p.rotary_dim = 63; }, FLASHATTN_STATUS_BAD_ROTARY, "rotary_dim", valid_append},
        {"rotary_dim above head_dim", [](auto &p) { p.rotary_dim = 130; }, FLASHATTN_STATUS_BAD_ROTARY, "rotary_dim", valid_append},
        {"seqlen_ro zero", [](auto &p) { p.seqlen_ro = 0; }, FLASHATTN_STATUS_BAD_ROTARY, "seqlen_ro", valid_append},
        {"rotary_dim without tables", [](auto &p) { p.rotary_dim = 64; }, FLASHATTN_STATUS_BAD_ROTARY, "rotary_dim", valid_params},
        {"interleaved flag 2", [](auto &p) { p.rotary_interleaved = 2; }, FLASHATTN_STATUS_BAD_ROTARY, "rotary_interleaved", valid_append},
        {"q position flag -1", [](auto &p) { p.rotary_q_at_cache_len = -1; }, FLASHATTN_STATUS_BAD_ROTARY, "rotary_q_at_cache_len", valid_append},
        {"rotary table misaligned", [](auto &p) { p.rotary_cos = (const void *)0x760001; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "rotary_cos", valid_append},
    };
    return cases;
}

TEST(Serving, AppendPlansTheRotatedQueryInTheWorkspace) {
    for (const fa_device_caps &caps : {h200_caps(), a100_caps()}) {
        flashattn_fwd_params p = valid_append();
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
        fa_plan plan;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
        EXPECT_EQ(1, plan.append);
        EXPECT_EQ(2, plan.kp.seqused_add);
        EXPECT_EQ(0, plan.q_rot_off % 256);
        EXPECT_GE(plan.workspace_bytes, plan.q_rot_off + 3 * 2 * 8 * 128 * 2);  // batch 3 x 2 rows x 8 heads x 128
        if (plan.kp.num_splits > 1) EXPECT_GE(plan.q_rot_off, plan.lse_accum_off);  // after the split regions
        EXPECT_EQ(64, plan.app.rotary_dim);
        EXPECT_EQ(200, plan.app.seqlen_cap);
        // Without the tables, no workspace for Q: exactly what the same call without an append needs
        // (its split regions, if any); no queries, still not a no-op (the cache is written).
        p.rotary_cos = p.rotary_sin = nullptr, p.rotary_dim = 0, p.seqlen_ro = 0;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
        flashattn_fwd_params no_append = p;
        no_append.k_new = no_append.v_new = nullptr, no_append.seqlen_new = 0;
        fa_plan plain;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &no_append, 0, &plain)) << flashattn_last_error();
        EXPECT_EQ(plain.workspace_bytes, plan.workspace_bytes);
        p.seqlen_q = 0;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
        EXPECT_EQ(0, plan.noop);
        EXPECT_EQ(1, plan.append);
    }
}

TEST(Serving, ValidServingParamsPassAndPlanAsDenseCallsDo) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    for (const fa_device_caps &caps : {h200_caps(), a100_caps()})
        for (const flashattn_fwd_params &p : {valid_varlen_paged(), valid_varlen_packed(), valid_indexed_cache(), valid_page_lists()}) {
            EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
            fa_plan plan;
            ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
            // AUTO: FUSED_SM90 on Hopper (head dim 128, pages of 16 keys), FUSED elsewhere.
            EXPECT_EQ(caps.cc_major == 9 ? FLASHATTN_BACKEND_FUSED_SM90 : FLASHATTN_BACKEND_FUSED, plan.backend);
            EXPECT_EQ(1, plan.kp.serving);
            // Packed or not, a call splits its keys when its tiles are too few (a workspace).
            EXPECT_EQ(plan.kp.num_splits > 1, plan.workspace_bytes > 0);
            EXPECT_EQ(p.batch, plan.grid_z);
        }
    const fa_device_caps caps = h200_caps();
    const flashattn_fwd_params p = valid_varlen_paged();
    fa_plan plan;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan));
    EXPECT_EQ(16, plan.kp.page_size);
    EXPECT_EQ(64, plan.kp.num_pages);
    EXPECT_EQ(16, plan.kp.block_table_stride);
    EXPECT_EQ(300, plan.kp.total_q);
    // A dense call keeps serving off (its kernels carry none of the serving code).
    const flashattn_fwd_params d = valid_params();
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &d, 0, &plan));
    EXPECT_EQ(0, plan.kp.serving);
}

TEST(Serving, WindowsAreClampedForTheKernel) {
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params p = valid_varlen_paged();
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, p.window_left = INT64_MAX, p.window_right = 3;
    fa_plan plan;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan));
    EXPECT_EQ(1, plan.kp.mask_kind);
    EXPECT_EQ((int32_t)1 << 30, plan.kp.window_left);
    EXPECT_EQ(3, plan.kp.window_right);
}

TEST(Serving, ReferenceGathersServingCallsInItsWorkspace) {
    // REFERENCE (forced; AUTO prefers the fused kernels) copies each sequence's Q, K and V into dense
    // [batch, capacity] tensors after its usual regions.
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params p = valid_varlen_paged();
    p.backend = FLASHATTN_BACKEND_REFERENCE;
    fa_plan plan;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, plan.backend);
    EXPECT_GE(plan.ref.gathered, plan.ref.cublas_ws + FA_CUBLAS_WORKSPACE_BYTES);
    EXPECT_EQ(0, plan.ref.gathered % 256);
    const int64_t dense = 2 * (3 * 100 * 8 * 128 + 2 * 3 * 200 * 2 * 128);  // Q, K, V at the capacities
    EXPECT_GE(plan.ref.total, plan.ref.gathered + dense);
    EXPECT_EQ(plan.ref.total, plan.workspace_bytes);
    // A dense call has no such region.
    flashattn_fwd_params d = valid_params();
    d.backend = FLASHATTN_BACKEND_REFERENCE;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &d, 0, &plan));
    EXPECT_EQ(0, plan.ref.gathered);
}

TEST(Serving, Sm90TakesEveryPageSize) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    // Head dim 128: pages that tile its 128-key tiles are read by TMA, others gathered; AUTO picks
    // FUSED_SM90 for all of them on Hopper.
    const fa_device_caps caps = h200_caps();
    for (int64_t page : {8, 16, 32, 64, 128, 256, 384, 1, 4, 19, 48, 100, 200}) {
        flashattn_fwd_params p = valid_varlen_paged();
        p.page_size = page, p.pages_per_seq = (200 + page - 1) / page, p.block_table_batch_stride = p.pages_per_seq;
        p.k_batch_stride = p.v_batch_stride = page * p.k_seq_stride;
        fa_plan plan;
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << page << ": " << flashattn_last_error();
        EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend) << page;
        EXPECT_EQ(page, plan.kp.page_size);
    }
}

TEST(Serving, Sm90SplitsDecodeWithDenseOrPackedQ) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    // Decode over a paged cache: one query per sequence, few tiles, long keys. A packed Q (varlen
    // decode) splits as the dense one does: same grid, same workspace.
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params p = valid_varlen_paged();
    p.batch = 1, p.seqlen_q = 1, p.seqlen_k = 8192, p.heads_q = 32, p.heads_kv = 8;
    p.page_size = 64, p.pages_per_seq = 128, p.block_table_batch_stride = 128, p.num_pages = 200;
    p.cu_seqlens_q = nullptr, p.total_q = 0;
    p.q_seq_stride = p.o_seq_stride = 32 * 128, p.q_batch_stride = p.o_batch_stride = 32 * 128;
    p.k_seq_stride = p.v_seq_stride = 8 * 128, p.k_batch_stride = p.v_batch_stride = 64 * 8 * 128;
    fa_plan plan;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(1, plan.kp.pack_gqa);
    EXPECT_GT(plan.kp.num_splits, 1);
    EXPECT_GT(plan.workspace_bytes, 0);
    p.cu_seqlens_q = (const int32_t *)0x700000, p.total_q = 1, p.q_batch_stride = p.o_batch_stride = 0;
    fa_plan packed;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &packed)) << flashattn_last_error();
    EXPECT_EQ(1, packed.kp.pack_gqa);
    EXPECT_EQ(plan.kp.num_splits, packed.kp.num_splits);
    EXPECT_EQ(plan.grid_x, packed.grid_x);
    EXPECT_EQ(plan.workspace_bytes, packed.workspace_bytes);
}

TEST(Validation, ValidParamsPass) {
    flashattn_fwd_params p = valid_params();
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
    // The last element one below that limit: the tensor ends at byte INT64_MAX - 1, which fits.
    p.v_batch_stride = INT64_MAX / 2 - 1 - (199 * 256 + 128 + 127);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
}

TEST(Validation, EveryBadInputHasItsStatusAndMessage) {
    for (const BadCase &c : bad_cases()) {
        flashattn_fwd_params p = c.base();
        c.mutate(p);
        fa_clear_error();
        const flashattn_status st = fa_validate(&p);
        EXPECT_EQ(c.expected, st) << c.what << ": got " << flashattn_status_name(st) << " ("
                                  << flashattn_last_error() << ")";
        EXPECT_NE(std::string(flashattn_last_error()).find(c.message_mentions), std::string::npos)
            << c.what << ": message '" << flashattn_last_error() << "' does not mention '"
            << c.message_mentions << "'";
        // The planner (behind every public query and the forward call) reports the same status.
        const fa_device_caps caps = h200_caps();
        fa_plan plan;
        EXPECT_EQ(c.expected, fa_plan_make(&caps, &p, 0, &plan)) << c.what;
    }
}

TEST(Validation, SlopesAndBlockTableEndAtTheInt64Edge) {
    // The last element's end, (index + 1) x 4 bytes, must fit in int64: an index of INT64_MAX / 4
    // (2^61 - 1) ends at byte 2^63 and is refused; one below it is taken (the fuzzer's input had
    // found the first accepted).
    flashattn_fwd_params p = valid_params();  // batch 2, heads_q 8: last slope = stride + 7
    p.alibi_slopes = (const float *)0x600000;
    p.alibi_batch_stride = INT64_MAX / 4 - 7;
    EXPECT_EQ(FLASHATTN_STATUS_INDEX_OVERFLOW, fa_validate(&p));
    EXPECT_NE(std::string(flashattn_last_error()).find("alibi_slopes"), std::string::npos) << flashattn_last_error();
    p.alibi_batch_stride = INT64_MAX / 4 - 8;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
    p = valid_varlen_paged();  // batch 3: last entry = 2 x stride + pages_per_seq - 1
    p.pages_per_seq = 14;
    p.block_table_batch_stride = (INT64_MAX / 4 - 13) / 2;
    EXPECT_EQ(FLASHATTN_STATUS_INDEX_OVERFLOW, fa_validate(&p));
    EXPECT_NE(std::string(flashattn_last_error()).find("block_table"), std::string::npos) << flashattn_last_error();
    p.block_table_batch_stride -= 1;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
}

TEST(Validation, NullParamsAndHandle) {
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, fa_validate(nullptr));
    flashattn_fwd_params p = valid_params();
    size_t bytes = 123;
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd_workspace_size(nullptr, &p, &bytes));
    EXPECT_NE(std::string(flashattn_last_error()).find("handle"), std::string::npos);
    EXPECT_EQ(123u, bytes);
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd_supported(nullptr, &p));
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd(nullptr, &p, nullptr, 0, nullptr));
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_fwd_plan(nullptr, &p, &info));
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_handle_destroy(nullptr));
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_handle_create(nullptr, 0));
    int dev = 0;
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_handle_device(nullptr, &dev));
}

TEST(Validation, EmptyTensorsMayBeNull) {
    flashattn_fwd_params p = valid_params();
    p.seqlen_k = 0;
    p.k = p.v = nullptr;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
    p = valid_params();
    p.seqlen_q = 0;
    p.q = nullptr;
    p.o = nullptr;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
}

TEST(Validation, LayoutsThatAreFine) {
    // [B, H, S, D] layout, zero batch stride for broadcast K/V, scale 0 = default.
    flashattn_fwd_params p = valid_params();
    p.q_head_stride = p.seqlen_q * p.head_dim, p.q_seq_stride = p.head_dim;
    p.q_batch_stride = p.heads_q * p.seqlen_q * p.head_dim;
    p.o_head_stride = p.q_head_stride, p.o_seq_stride = p.q_seq_stride, p.o_batch_stride = p.q_batch_stride;
    p.k_batch_stride = 0, p.v_batch_stride = 0;
    p.softmax_scale = 0.0f;
    p.window_left = 0, p.window_right = 0;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
    // An output with seq_len 1 may have any seq stride.
    p = valid_params();
    p.seqlen_q = 1;
    p.o_seq_stride = 0;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_validate(&p)) << flashattn_last_error();
}

TEST(Validation, LastErrorIsPerThread) {
    flashattn_fwd_params p = valid_params();
    p.head_dim = 999;
    ASSERT_EQ(FLASHATTN_STATUS_UNSUPPORTED_HEAD_DIM, fa_validate(&p));
    std::string other;
    std::thread([&] { other = flashattn_last_error(); }).join();
    EXPECT_EQ("", other);
    EXPECT_NE(std::string(flashattn_last_error()).find("999"), std::string::npos);
    flashattn_fwd_params q;
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_init(&q));
    EXPECT_STREQ("", flashattn_last_error());  // cleared by a successful call
}

// ---- planning ------------------------------------------------------------------------------------

fa_plan plan_ok(const flashattn_fwd_params &p, const fa_device_caps &caps) {
    fa_plan plan;
    const flashattn_status st = fa_plan_make(&caps, &p, 0, &plan);
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, st) << flashattn_last_error();
    return plan;
}

TEST(Planning, AutoPicksFusedWithTheTableTiles) {
    flashattn_fwd_params p = valid_params();
    p.batch = 14;  // 14 x 8 heads: enough tiles for the A100's 108 SMs, so no split
    flashattn_fwd_params_set_packed_strides(&p);
    const fa_plan plan = plan_ok(p, a100_caps());
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED, plan.backend);
    EXPECT_EQ(128, plan.cfg.head_dim);
    EXPECT_EQ(1, plan.kp.num_splits);
    EXPECT_EQ(0, plan.workspace_bytes);
    EXPECT_EQ((100 + plan.cfg.block_m - 1) / plan.cfg.block_m, plan.grid_x);
    EXPECT_EQ(8, plan.grid_y);
    EXPECT_EQ(14, plan.grid_z);
    EXPECT_EQ(32 * plan.cfg.warps, plan.threads);
    EXPECT_EQ(fa_fused_smem_bytes(&plan.cfg), plan.smem_bytes);
    EXPECT_EQ(4, plan.kp.head_group);
}

TEST(Planning, FusedSplitsTheKeysOfCallsWithTooFewTiles) {
    // 2 x 8 heads x 1 query tile = 16 blocks for 108 SMs of two resident blocks each: the keys split
    // as FUSED_SM90's do (at least 2 key tiles each), with a workspace for the partial results,
    // merged after.
    flashattn_fwd_params p = valid_params();
    p.seqlen_k = 4096;
    flashattn_fwd_params_set_packed_strides(&p);
    const fa_plan plan = plan_ok(p, a100_caps());
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    ASSERT_EQ(FLASHATTN_BACKEND_FUSED, plan.backend);
    EXPECT_EQ(13, plan.kp.num_splits);  // 2 x 108 / 16 blocks, rounded down
    EXPECT_EQ(13, plan.grid_x);
    EXPECT_GE(plan.workspace_bytes, 13LL * 2 * 8 * 100 * (128 + 1) * 4);
    EXPECT_GE(plan.lse_accum_off, plan.o_accum_off + 13LL * 2 * 8 * 100 * 128 * 4);
    // A packed (ragged) Q of the same capacities splits the same way: the partial results are
    // [batch, seqlen_q] by capacity, and the combine writes each sequence's packed rows.
    flashattn_fwd_params r = valid_varlen_packed();
    r.seqlen_k = 4096, r.total_k = 8192;
    const fa_plan rp = plan_ok(r, a100_caps());
    EXPECT_EQ(13, rp.kp.num_splits);
    EXPECT_EQ(plan.workspace_bytes, rp.workspace_bytes);
    EXPECT_EQ(plan.lse_accum_off, rp.lse_accum_off);
    // The plan flashattn_fwd falls back to when a caller gives FUSED no workspace (as before 0.4.0).
    const fa_device_caps caps = a100_caps();
    fa_plan unsplit;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, FA_PLAN_NO_SPLIT, &unsplit));
    EXPECT_EQ(1, unsplit.kp.num_splits);
    EXPECT_EQ(1, unsplit.grid_x);
    EXPECT_EQ(0, unsplit.workspace_bytes);
}

TEST(Planning, AutoPicksSm90OnHopperWhereTheTableSaysSo) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    flashattn_fwd_params p = valid_params();  // head dim 128
    const fa_plan plan = plan_ok(p, h200_caps());
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(128, plan.cfg.head_dim);
    EXPECT_EQ(0, plan.cfg.block_m % 64);  // 64 rows per consumer warpgroup
    EXPECT_EQ(32 * plan.cfg.warps, plan.threads);
    EXPECT_EQ(128 * (plan.cfg.block_m / 64 + 1), plan.threads);  // plus the producer warpgroup
    EXPECT_EQ(fa_sm90_smem_bytes(128, plan.cfg.block_m, plan.cfg.block_n, 0, 0), plan.smem_bytes);
    EXPECT_EQ(0, plan.workspace_bytes);
    EXPECT_EQ((100 + 127) / 128, plan.grid_x);
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    fa_plan_describe(&plan, &info);
    EXPECT_EQ(0, std::string(info.kernel_name).rfind("fused_sm90_bf16_d128_m128_", 0)) << info.kernel_name;
    EXPECT_NE(std::string(info.description).find("backend=FUSED_SM90"), std::string::npos);
    // Not on an A100: AUTO takes FUSED there, and a forced FUSED_SM90 is refused with the reason.
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED, plan_ok(p, a100_caps()).backend);
    p.backend = FLASHATTN_BACKEND_FUSED_SM90;
    fa_plan refused;
    const fa_device_caps a100 = a100_caps();
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&a100, &p, 0, &refused));
    EXPECT_NE(std::string(flashattn_last_error()).find("compute capability 9.0"), std::string::npos);
    // Forced on Hopper, any multiple of 8 runs on the smallest variant that holds it.
    const fa_device_caps h200 = h200_caps();
    for (auto [d, khd] : {std::pair<int, int>{8, 64}, {72, 128}, {128, 128}, {136, 192}, {160, 192}, {192, 192}, {200, 256}, {256, 256}}) {
        p.head_dim = d;
        flashattn_fwd_params_set_packed_strides(&p);
        if (!fa_sm90_compiled(p.dtype, khd)) continue;
        EXPECT_EQ(khd, plan_ok(p, h200).cfg.head_dim) << "head dim " << d;
    }
    p.head_dim = 36;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&h200, &p, 0, &refused));
    EXPECT_NE(std::string(flashattn_last_error()).find("multiple of 8"), std::string::npos);
    // K shared by every batch entry (stride 0): TMA cannot express it; AUTO takes FUSED instead.
    p = valid_params();
    p.k_batch_stride = 0;
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED, plan_ok(p, h200).backend);
    p.backend = FLASHATTN_BACKEND_FUSED_SM90;
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&h200, &p, 0, &refused));
    EXPECT_NE(std::string(flashattn_last_error()).find("k_batch_stride"), std::string::npos) << flashattn_last_error();
}

TEST(Planning, Sm90DecodePacksQueryGroupsAndSplitsKeys) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    flashattn_fwd_params p = valid_params();
    p.batch = 1, p.seqlen_q = 1, p.seqlen_k = 8192, p.heads_q = 32, p.heads_kv = 8, p.head_dim = 128;
    flashattn_fwd_params_set_packed_strides(&p);
    const fa_plan plan = plan_ok(p, h200_caps());
    ASSERT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(64, plan.cfg.block_m);  // the single-consumer decode tile: the group's 4 rows fit
    EXPECT_EQ(1, plan.kp.pack_gqa);
    EXPECT_EQ(64 / 4, plan.kp.pack_rows);
    EXPECT_EQ(8, plan.grid_y);  // one tile per KV head
    EXPECT_EQ(16, plan.kp.num_splits);  // 132 SMs / 8 tiles, rounded down; under 8192/128/2 key tiles
    EXPECT_EQ(16, plan.grid_x);
    const int64_t o_bytes = 16LL * 32 * 128 * 4, lse_bytes = 16LL * 32 * 4;
    EXPECT_GE(plan.workspace_bytes, o_bytes + lse_bytes);
    EXPECT_LE(plan.lse_accum_off, plan.workspace_bytes - lse_bytes);
    EXPECT_GE(plan.lse_accum_off, plan.o_accum_off + o_bytes);
    EXPECT_EQ(0, plan.o_accum_off % FA_WORKSPACE_ALIGN);
    EXPECT_EQ(0, plan.lse_accum_off % FA_WORKSPACE_ALIGN);
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    fa_plan_describe(&plan, &info);
    EXPECT_EQ(16, info.num_splits);
    EXPECT_EQ(plan.workspace_bytes, info.workspace_bytes);
    EXPECT_NE(std::string(info.description).find("gqa_packed"), std::string::npos) << info.description;
    // Enough tiles to fill the GPU: no split and no workspace; no grouping: no packing.
    p.batch = 64;
    EXPECT_EQ(1, plan_ok(p, h200_caps()).kp.num_splits);
    EXPECT_EQ(0, plan_ok(p, h200_caps()).workspace_bytes);
    p.batch = 1, p.heads_kv = 32;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(0, plan_ok(p, h200_caps()).kp.pack_gqa);
    // 16 queries of a group of 8 (128 rows) do not fit the single-consumer tile: the two-consumer
    // tile reads K and V once per group instead of twice.
    p.seqlen_q = 16, p.heads_q = 32, p.heads_kv = 4;
    flashattn_fwd_params_set_packed_strides(&p);
    const fa_plan spec = plan_ok(p, h200_caps());
    EXPECT_EQ(128, spec.cfg.block_m);
    EXPECT_EQ(1, spec.kp.pack_gqa);
    EXPECT_EQ(1, spec.kp.num_m_blocks);
    // Prefill: neither.
    const fa_plan pre = plan_ok(valid_params(), h200_caps());
    EXPECT_EQ(0, pre.kp.pack_gqa);
    EXPECT_EQ(1, pre.kp.num_splits);
    EXPECT_EQ(0, pre.workspace_bytes);
}

// FUSED_SM90 split decode whose K/V tiles are each read by one block, over at most three L2s of
// keys and values, loads them with an evict-first L2 policy (fa_sm90_kv_evict_first); more bytes, no
// split, or query tiles that share K/V do not, nor does the portable FUSED kernel.
TEST(Planning, Sm90SplitDecodeLoadsKeysAndValuesEvictFirst) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    fa_device_caps caps = h200_caps();
    caps.l2_bytes = 50LL << 20;
    struct Case {
        int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        int want;
    } cases[] = {
        {1, 32, 8, 1, 8192, 1},     // 32 MB of K/V, 16 splits
        {2, 32, 8, 1, 8192, 1},
        {1, 32, 8, 1, 32768, 1},    // 128 MB: under 150
        {1, 32, 8, 1, 65536, 0},    // 256 MB
        {1, 32, 8, 1, 131072, 0},
        {16, 32, 8, 1, 8192, 0},    // 128 tiles: no split
        {1, 16, 16, 1, 8192, 1},    // one query head a KV head
        {1, 32, 8, 200, 8192, 0},   // query tiles: K/V shared across them
    };
    for (const Case &c : cases) {
        flashattn_fwd_params p = valid_params();
        p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k, p.heads_q = c.heads_q,
        p.heads_kv = c.heads_kv, p.head_dim = 128;
        flashattn_fwd_params_set_packed_strides(&p);
        const fa_plan plan = plan_ok(p, caps);
        const std::string what = std::to_string(c.batch) + "x" + std::to_string(c.heads_q) + "/" +
                                 std::to_string(c.heads_kv) + " " + std::to_string(c.seqlen_q) + "x" +
                                 std::to_string(c.seqlen_k);
        ASSERT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend) << what;
        EXPECT_EQ(c.want, plan.kp.kv_evict_first) << what << " splits " << plan.kp.num_splits;
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        fa_plan_describe(&plan, &info);
        EXPECT_EQ(c.want != 0, std::string(info.description).find("kv_evict_first") != std::string::npos)
            << what << ": " << info.description;
        p.backend = FLASHATTN_BACKEND_FUSED;
        EXPECT_EQ(0, plan_ok(p, caps).kp.kv_evict_first) << what;
    }
}

// A plan description too long for its 192 bytes (a split decode over pages of 1024, gathered, with
// 16 query heads a KV head, that appends with rotary) leaves out threads=, smem= and workspace=
// (fields of their own) and keeps its last words; one that fits keeps them.
TEST(Planning, LongDescriptionsKeepTheirLastWords) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params p = valid_params();
    p.batch = 1, p.seqlen_q = 1, p.seqlen_k = 8192, p.heads_q = 128, p.heads_kv = 8, p.head_dim = 128;
    flashattn_fwd_params_set_packed_strides(&p);
    p.seqused_k = (const int32_t *)0x710000;
    p.block_table = (const int32_t *)0x720000, p.page_size = 1024, p.pages_per_seq = 8;
    p.block_table_batch_stride = 8, p.num_pages = 8, p.k_batch_stride = p.v_batch_stride = 1024 * p.k_seq_stride;
    p.k_new = (const void *)0x740000, p.v_new = (const void *)0x750000, p.seqlen_new = 1;
    p.k_new_head_stride = p.v_new_head_stride = 128, p.k_new_seq_stride = p.v_new_seq_stride = 8 * 128;
    p.k_new_batch_stride = p.v_new_batch_stride = 8 * 128;
    p.rotary_cos = (const void *)0x760000, p.rotary_sin = (const void *)0x770000;
    p.rotary_dim = 128, p.seqlen_ro = 8193, p.rotary_interleaved = 1;
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    const fa_plan long_plan = plan_ok(p, caps);
    fa_plan_describe(&long_plan, &info);
    const std::string d = info.description;
    EXPECT_LT(d.size(), sizeof info.description);
    const std::string tail = " append+rotary kv_evict_first";
    ASSERT_GE(d.size(), tail.size()) << d;
    EXPECT_EQ(tail, d.substr(d.size() - tail.size())) << d;
    for (const char *w : {"backend=FUSED_SM90 ", "kernel=fused_sm90_bf16_d128_m64_n128_w8 ", "splits=16", " gqa_packed",
                          " seqused_k", " paged=1024:gather"})
        EXPECT_NE(std::string::npos, d.find(w)) << w << ": " << d;
    EXPECT_EQ(std::string::npos, d.find("workspace=")) << d;
    // Without the append the line fits, and keeps every figure.
    p.k_new = p.v_new = nullptr, p.seqlen_new = 0, p.rotary_cos = p.rotary_sin = nullptr, p.rotary_dim = p.seqlen_ro = 0;
    p.k_new_batch_stride = p.k_new_seq_stride = p.k_new_head_stride = 0;
    p.v_new_batch_stride = p.v_new_seq_stride = p.v_new_head_stride = 0;
    const fa_plan short_plan = plan_ok(p, caps);
    fa_plan_describe(&short_plan, &info);
    const std::string f = info.description;
    for (const char *w : {"threads=256 ", "smem=", " workspace=", " kv_evict_first"})
        EXPECT_NE(std::string::npos, f.find(w)) << w << ": " << f;
}

// FUSED_SM90 decode-shaped calls at head dims 64 and 128 with grouped query heads take the
// single-consumer 64-row tile (192 keys at head dim 64, 128 at 128) when it holds a KV group's query
// rows (seqlen_q x group <= 64, and 2 x seqlen_q <= 64); otherwise (and without groups) the 128-row
// tile, as every other head dim does. (A dense call's 64-row tile has one consumer: 256 threads.)
TEST(Planning, Sm90DecodeTakesTheSingleConsumerTileWhereTheGroupFits) {
    struct Case { int64_t sq, hq, hkv, d; int mask; int64_t block_m; const char *kernel; };
    const Case cases[] = {
        {1, 32, 8, 128, FLASHATTN_MASK_NONE, 64, "fused_sm90_bf16_d128_m64_n128_w8"},    // 4 rows
        {1, 64, 1, 128, FLASHATTN_MASK_NONE, 64, nullptr},                               // MQA: 64 rows
        {1, 128, 1, 128, FLASHATTN_MASK_NONE, 128, nullptr},                             // 128 rows
        {1, 16, 16, 128, FLASHATTN_MASK_NONE, 128, nullptr},                             // MHA: no group
        {32, 16, 16, 128, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 128, nullptr},             // MHA, 32 queries
        {8, 32, 16, 128, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 64, nullptr},               // 16 rows, group 2
        {33, 32, 16, 128, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 128, nullptr},             // not decode-shaped
        {4, 32, 8, 128, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 64, nullptr},                // 16 rows
        {1, 32, 8, 64, FLASHATTN_MASK_NONE, 64, "fused_sm90_bf16_d64_m64_n192_w8"},      // head dim 64: 192-key tiles
        {1, 16, 16, 64, FLASHATTN_MASK_NONE, 128, nullptr},                              //   (MHA: two consumers)
        {4, 32, 8, 64, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 64, nullptr},                 //   16 rows
        {1, 32, 8, 256, FLASHATTN_MASK_NONE, 128, nullptr},                              // other head dims:
        {1, 32, 8, 192, FLASHATTN_MASK_NONE, 128, nullptr},                              // two consumers
    };
    int checked = 0;
    for (const Case &c : cases) {
        if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, c.d)) continue;  // (a build restricted to other head dims)
        ++checked;
        SCOPED_TRACE("sq " + std::to_string(c.sq) + " heads " + std::to_string(c.hq) + "/" + std::to_string(c.hkv) +
                     " d " + std::to_string(c.d));
        flashattn_fwd_params p = valid_params();
        p.batch = 2, p.seqlen_q = c.sq, p.seqlen_k = 4096, p.heads_q = c.hq, p.heads_kv = c.hkv, p.head_dim = c.d;
        p.mask = c.mask;
        flashattn_fwd_params_set_packed_strides(&p);
        const fa_plan plan = plan_ok(p, h200_caps());
        ASSERT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
        EXPECT_EQ(c.block_m, plan.cfg.block_m);
        EXPECT_EQ(c.block_m == 64 ? 256 : 384, plan.threads);
        if (c.block_m == 64) {  // packed; 16 tiles, too few for resident blocks
            EXPECT_EQ(1, plan.kp.pack_gqa);
            EXPECT_EQ(0, plan.kp.persistent);
        }
        if (c.kernel) {
            flashattn_plan_info info;
            flashattn_plan_info_init(&info);
            fa_plan_describe(&plan, &info);
            EXPECT_STREQ(c.kernel, info.kernel_name);
        }
    }
    if (checked == 0) GTEST_SKIP() << "no FUSED_SM90 kernel for head dims 64, 128, 192 or 256 in this build";
}

// Serving decode on FUSED_SM90: the 64-row tile with one consumer warpgroup (256 threads), split
// or not, over pages gathered with cp.async (every page size in a split decode; TMA reads pages of
// 256 keys for an unsplit one), a cache, and a dense decode. (Two consumers taking halves of each
// key tile, the key-split blocks of 0.4.0, were slower at every measured shape:
// docs/performance.md v53.)
TEST(Planning, Sm90ServingDecodeRunsOneConsumer) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params v = valid_varlen_paged();  // decode: one query a sequence, 4096 keys of capacity
    v.backend = FLASHATTN_BACKEND_FUSED_SM90;
    v.heads_q = 32, v.heads_kv = 8, v.seqlen_q = 1, v.seqlen_k = 4096, v.total_q = 3;
    flashattn_fwd_params_set_packed_strides(&v);
    v.q_batch_stride = v.o_batch_stride = 0;
    auto paged = [&](int64_t page) {
        flashattn_fwd_params x = v;
        x.page_size = page, x.pages_per_seq = (4096 + page - 1) / page, x.block_table_batch_stride = x.pages_per_seq;
        x.num_pages = 3 * x.pages_per_seq, x.k_batch_stride = x.v_batch_stride = page * x.k_seq_stride;
        return plan_ok(x, caps);
    };
    for (int64_t page : {256, 64, 16, 19}) {
        SCOPED_TRACE("pages of " + std::to_string(page));
        const fa_plan plan = paged(page);
        ASSERT_EQ(64, plan.cfg.block_m);
        EXPECT_GT(plan.kp.num_splits, 1);
        // (a split decode gathers its pages, whatever their size)
        EXPECT_EQ(1, plan.kp.gather_pages);
        EXPECT_EQ(256, plan.threads);
        EXPECT_EQ(1, plan.kp.kv_evict_first);  // (a split decode, K/V read once: by TMA boxes or gathered)
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        fa_plan_describe(&plan, &info);
        EXPECT_EQ(8, info.num_warps);
        EXPECT_NE(std::string(info.description).find("kv_evict_first"), std::string::npos) << info.description;
        EXPECT_STREQ("fused_sm90_bf16_d128_m64_n128_w8", info.kernel_name);
    }
    flashattn_fwd_params c = v;  // a dense cache with per-sequence counts
    c.block_table = nullptr, c.pages_per_seq = c.block_table_batch_stride = c.page_size = c.num_pages = 0;
    c.cu_seqlens_q = nullptr, c.total_q = 0;
    flashattn_fwd_params_set_packed_strides(&c);
    const fa_plan cache_plan = plan_ok(c, caps);
    EXPECT_GT(cache_plan.kp.num_splits, 1);
    EXPECT_EQ(256, cache_plan.threads);
    // Tiles that fill the SMs unsplit (40 sequences x 8 KV heads > 132), over the cache and over
    // pages of 256: the same tile.
    for (bool pages : {false, true}) {
        SCOPED_TRACE(pages ? "pages of 256" : "a cache");
        flashattn_fwd_params u = pages ? v : c;
        u.batch = 40;
        if (pages) {
            u.total_q = 40, u.page_size = 256, u.pages_per_seq = u.block_table_batch_stride = 16;
            u.num_pages = 40 * 16, u.k_batch_stride = u.v_batch_stride = 256 * u.k_seq_stride;
        }
        const fa_plan plan = plan_ok(u, caps);
        ASSERT_EQ(64, plan.cfg.block_m);
        EXPECT_EQ(1, plan.kp.num_splits);
        EXPECT_EQ(0, plan.kp.gather_pages);
        EXPECT_EQ(256, plan.threads);
    }
    flashattn_fwd_params dec = valid_params();  // a dense decode: the same tile
    dec.seqlen_q = 1, dec.heads_q = 32, dec.heads_kv = 8, dec.seqlen_k = 4096;
    dec.backend = FLASHATTN_BACKEND_FUSED_SM90;
    flashattn_fwd_params_set_packed_strides(&dec);
    const fa_plan dense = plan_ok(dec, caps);
    EXPECT_EQ(64, dense.cfg.block_m);
    EXPECT_EQ(256, dense.threads);
}

// FUSED_SM90 calls whose tiles are all the same work (no mask, no window) and outnumber the SMs run
// one resident block per SM that takes tile after tile; anything else keeps a block per tile.
TEST(Planning, Sm90UnmaskedCallsWithManyTilesArePersistent) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params p = valid_params();
    p.batch = 32, p.seqlen_q = p.seqlen_k = 512, p.heads_q = p.heads_kv = 16, p.head_dim = 128;
    flashattn_fwd_params_set_packed_strides(&p);
    fa_plan plan = plan_ok(p, caps);
    ASSERT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(1, plan.kp.persistent);
    EXPECT_EQ(4, plan.kp.num_m_blocks);  // 2048 tiles over 132 resident blocks
    EXPECT_EQ(132, plan.grid_x);
    EXPECT_EQ(1, plan.grid_y);
    EXPECT_EQ(1, plan.grid_z);
    EXPECT_EQ(0, plan.kp.sched_heads);
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    fa_plan_describe(&plan, &info);
    EXPECT_NE(std::string(info.description).find(" persistent"), std::string::npos) << info.description;
    EXPECT_EQ(132, info.grid_x);
    // The epilogue's own O tile where it fits (head dims 64 and 128), Q's rows otherwise; a second
    // Q buffer where that fits too (a serving call's with 128 bytes more for two 64-byte tile
    // records and their barriers); a block a tile has neither. A serving block with neither has
    // 128 bytes more of barriers for its second consumer's rows of Q.
    EXPECT_EQ(1024 + 2 * 128 * (128 + 4 * 128) + 128 + 2 * (2 * 128 * 128), plan.smem_bytes);
    EXPECT_LE(plan.smem_bytes, FA_SM90_SMEM_MAX);
    EXPECT_EQ(1024 + 2 * 128 * (128 + 4 * 128) + 128 + 2 * (2 * 128 * 128) + 128, fa_sm90_smem_bytes(128, 128, 128, 1, 1));
    EXPECT_LE(fa_sm90_smem_bytes(128, 128, 128, 1, 1), FA_SM90_SMEM_MAX);
    EXPECT_EQ(1024 + 2 * 64 * (128 + 4 * 128) + 128 + 2 * (2 * 64 * 128) + 128, fa_sm90_smem_bytes(64, 128, 128, 1, 1));
    EXPECT_EQ(1024 + 2 * 256 * (128 + 4 * 80) + 128 + 128, fa_sm90_smem_bytes(256, 128, 80, 1, 1));
    EXPECT_EQ(1024 + 2 * 192 * (128 + 4 * 112) + 128 + 128, fa_sm90_smem_bytes(192, 128, 112, 1, 1));
    EXPECT_EQ(1024 + 2 * 128 * (128 + 4 * 176) + 128 + 128, fa_sm90_smem_bytes(128, 128, 176, 1, 1));
    for (auto [hd, bn] : std::vector<std::array<int, 2>>{{256, 80}, {192, 112}, {128, 176}})
        EXPECT_LE(fa_sm90_smem_bytes(hd, 128, bn, 1, 1), FA_SM90_SMEM_MAX) << hd;
    EXPECT_EQ(1024 + 2 * 64 * (192 + 4 * 128) + 128 + 2 * (2 * 64 * 192), fa_sm90_smem_bytes(64, 192, 128, 1, 0));
    EXPECT_EQ(1024 + 2 * 128 * (128 + 4 * 176) + 128, fa_sm90_smem_bytes(128, 128, 176, 1, 0));
    EXPECT_EQ(1024 + 2 * 256 * (128 + 4 * 64) + 128, fa_sm90_smem_bytes(256, 128, 64, 1, 0));
    EXPECT_EQ(1024 + 2 * 128 * (128 + 4 * 128) + 128, fa_sm90_smem_bytes(128, 128, 128, 0, 0));
    auto persistent = [&](const flashattn_fwd_params &q) { return plan_ok(q, caps).kp.persistent; };
    flashattn_fwd_params q = p;
    // A causal mask: a tile's work grows linearly with its position; pairs of tiles of equal work.
    q.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    fa_plan pairs = plan_ok(q, caps);
    EXPECT_EQ(2, pairs.kp.persistent);
    EXPECT_EQ(0, pairs.kp.sched_heads);
    EXPECT_EQ(132, pairs.grid_x);  // 1024 pairs
    fa_plan_describe(&pairs, &info);
    EXPECT_NE(std::string(info.description).find(" persistent=pairs"), std::string::npos) << info.description;
    q.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT;
    EXPECT_EQ(2, persistent(q));
    // More queries than keys: the first rows of a bottom-right mask see none, and the work of a
    // top-left one stops growing; a block a tile.
    q.seqlen_q = 600;
    flashattn_fwd_params_set_packed_strides(&q);
    EXPECT_EQ(0, persistent(q));
    q.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    EXPECT_EQ(0, persistent(q));
    q = p, q.batch = 5, q.heads_q = q.heads_kv = 8, q.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;  // 160 tiles: 80 pairs
    flashattn_fwd_params_set_packed_strides(&q);
    EXPECT_EQ(2, persistent(q));
    EXPECT_EQ(80, plan_ok(q, caps).grid_x);
    // A window under which every row sees a key: tiles in the grid's order (the same work but for
    // the first few); one under which some row sees none keeps a block a tile.
    q = p, q.window_left = 1000;
    EXPECT_EQ(1, persistent(q));
    q = p, q.window_right = 1000;
    EXPECT_EQ(1, persistent(q));
    q = p, q.window_left = 64, q.window_right = 0, q.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    EXPECT_EQ(1, persistent(q));
    EXPECT_EQ(0, plan_ok(q, caps).kp.sched_heads);  // 4 query tiles a head: the grid order
    {
        // Enough query tiles a head for the heaviest-first order across sections of heads (32 or
        // more): a block a tile, taking them in that order.
        flashattn_fwd_params r = q;
        r.batch = 2, r.seqlen_q = r.seqlen_k = 8192, r.window_left = 4096;
        flashattn_fwd_params_set_packed_strides(&r);
        fa_device_caps l2 = caps;
        l2.l2_bytes = 50LL << 20;
        const fa_plan windowed = plan_ok(r, l2);
        EXPECT_EQ(0, windowed.kp.persistent);
        EXPECT_EQ(8, windowed.kp.sched_heads);  // 4 MiB of K and V per head; 33.3 MB / 4 MiB
        r.seqlen_q = r.seqlen_k = 31 * 128;     // fewer: resident blocks
        flashattn_fwd_params_set_packed_strides(&r);
        EXPECT_EQ(1, plan_ok(r, l2).kp.persistent);
    }
    q.seqlen_q = 600;  // more queries than keys: rows 0-87 see no key under a window of (64, 0)
    flashattn_fwd_params_set_packed_strides(&q);
    EXPECT_EQ(0, persistent(q));
    q = p, q.batch = 2;  // 128 tiles: no more than the SMs
    flashattn_fwd_params_set_packed_strides(&q);
    EXPECT_EQ(0, persistent(q));
    q = p, q.batch = 3;  // 192
    flashattn_fwd_params_set_packed_strides(&q);
    EXPECT_EQ(1, persistent(q));
    q = p, q.seqlen_q = 1, q.heads_kv = 4;  // decode: packed query heads, a block each
    flashattn_fwd_params_set_packed_strides(&q);
    EXPECT_EQ(0, persistent(q));
    q = p, q.backend = FLASHATTN_BACKEND_FUSED;  // the portable kernel: a block each
    EXPECT_EQ(0, persistent(q));
    flashattn_fwd_params v = valid_varlen_paged();  // a serving call with fewer tiles than SMs: a block each
    v.backend = FLASHATTN_BACKEND_FUSED_SM90;
    EXPECT_EQ(0, persistent(v));
    {
        // A serving decode (one query a sequence, 8 query heads over 2 KV heads: one consumer's tile
        // packs a KV group) with more tiles (batch x KV heads) than SMs: resident blocks, its tiles
        // in the grid's order (pairs under a causal mask), the block's shared memory the persistent
        // serving figure; over pages TMA reads (64 and 16 keys). With as many tiles as SMs or fewer
        // it splits its keys, a block each; over pages gathered row by row (8 keys), a block a tile.
        flashattn_fwd_params dec = valid_varlen_paged();
        dec.backend = FLASHATTN_BACKEND_FUSED_SM90, dec.heads_q = 8, dec.heads_kv = 2, dec.head_dim = 128;
        dec.batch = 70, dec.seqlen_q = 1, dec.total_q = 70, dec.seqlen_k = 1024, dec.page_size = 64;
        dec.pages_per_seq = dec.block_table_batch_stride = 16, dec.num_pages = 70 * 16;
        flashattn_fwd_params_set_packed_strides(&dec);
        dec.q_batch_stride = dec.o_batch_stride = 0, dec.k_batch_stride = dec.v_batch_stride = 64 * dec.k_seq_stride;
        const fa_plan resident = plan_ok(dec, caps);
        EXPECT_EQ(64, resident.cfg.block_m);
        EXPECT_EQ(1, resident.kp.pack_gqa);
        EXPECT_EQ(1, resident.kp.persistent);
        EXPECT_EQ(1, resident.kp.num_splits);
        EXPECT_EQ(70, resident.grid_x);  // 140 tiles in two rounds: 70 blocks of two
        EXPECT_EQ(1, resident.grid_y);
        EXPECT_EQ(1, resident.grid_z);
        EXPECT_EQ(fa_sm90_smem_bytes(128, 64, resident.cfg.block_n, 1, 1), resident.smem_bytes);
        EXPECT_EQ(140, fa_persistent_works(&resident.kp, fa_persistent_heads(&resident.kp)));  // batch x KV heads x one query tile
        dec.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        EXPECT_EQ(2, persistent(dec));
        dec.batch = 66, dec.total_q = 66;  // 132 tiles: no more than the SMs
        EXPECT_EQ(0, persistent(dec));
        dec.batch = 70, dec.total_q = 70, dec.page_size = 16;  // boxes of 16 keys: resident
        dec.pages_per_seq = dec.block_table_batch_stride = 64, dec.num_pages = 70 * 64;
        dec.k_batch_stride = dec.v_batch_stride = 16 * dec.k_seq_stride;
        EXPECT_EQ(0, plan_ok(dec, caps).kp.gather_pages);
        EXPECT_EQ(2, persistent(dec));
        dec.page_size = 8;  // gathered
        dec.pages_per_seq = dec.block_table_batch_stride = 128, dec.num_pages = 70 * 128;
        dec.k_batch_stride = dec.v_batch_stride = 8 * dec.k_seq_stride;
        EXPECT_EQ(1, plan_ok(dec, caps).kp.gather_pages);
        EXPECT_EQ(0, persistent(dec));
    }
    {
        // A dense decode on the same tile (128 sequences x 8 KV heads, groups of 4) goes on resident
        // blocks as a serving call of full sequences: the serving flag with none of its device
        // arrays, the call's mask and window for the kernel's serving_seq, the persistent serving
        // block's shared memory. With as many tiles as SMs or fewer it keeps its plan: a block a
        // tile (or split), not a serving call.
        flashattn_fwd_params dec = valid_params();
        dec.backend = FLASHATTN_BACKEND_FUSED_SM90, dec.batch = 128, dec.seqlen_q = 1, dec.seqlen_k = 2048;
        dec.heads_q = 32, dec.heads_kv = 8, dec.head_dim = 128;
        flashattn_fwd_params_set_packed_strides(&dec);
        const fa_plan resident = plan_ok(dec, caps);
        EXPECT_EQ(64, resident.cfg.block_m);
        EXPECT_EQ(1, resident.kp.pack_gqa);
        EXPECT_EQ(1, resident.kp.persistent);
        EXPECT_EQ(1, resident.kp.serving);
        EXPECT_EQ(nullptr, resident.kp.cu_seqlens_q);
        EXPECT_EQ(nullptr, resident.kp.seqused_k);
        EXPECT_EQ(nullptr, resident.kp.block_table);
        EXPECT_EQ(0, resident.kp.sched_heads);
        EXPECT_EQ(128, resident.grid_x);  // 1024 tiles in 8 rounds: 128 blocks of 8
        EXPECT_EQ(fa_sm90_smem_bytes(128, 64, resident.cfg.block_n, 1, 1), resident.smem_bytes);
        EXPECT_EQ(1024, fa_persistent_works(&resident.kp, fa_persistent_heads(&resident.kp)));
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        fa_plan_describe(&resident, &info);
        EXPECT_NE(std::string(info.description).find(" gqa_packed persistent"), std::string::npos) << info.description;
        dec.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, dec.seqlen_q = 4, dec.window_left = 100;
        flashattn_fwd_params_set_packed_strides(&dec);
        const fa_plan windowed = plan_ok(dec, caps);
        EXPECT_EQ(1, windowed.kp.persistent);  // (a window: the grid's order)
        EXPECT_EQ(1, windowed.kp.serving);
        EXPECT_EQ(FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, windowed.kp.mask_kind);
        EXPECT_EQ(100, windowed.kp.window_left);
        EXPECT_EQ(-1, windowed.kp.window_right);
        dec.window_left = -1;
        EXPECT_EQ(2, persistent(dec));
        // As few blocks as take the tiles in as many rounds as 132 would, every block taking that
        // many tiles or one fewer: 136 tiles (17 x 8 KV heads) on 68 blocks of two, 512 on 128 of
        // four, 528 on 132 of four, 264 on 132 of two, 144 on 72 of two.
        dec.window_left = -1, dec.mask = FLASHATTN_MASK_NONE, dec.seqlen_q = 1;
        for (const auto &[batch, blocks] : {std::pair{17, 68}, {64, 128}, {66, 132}, {33, 132}, {18, 72}}) {
            dec.batch = batch;
            flashattn_fwd_params_set_packed_strides(&dec);
            const fa_plan r = plan_ok(dec, caps);
            ASSERT_EQ(1, r.kp.persistent) << batch;
            EXPECT_EQ(blocks, r.grid_x) << batch;
            const int32_t heads = fa_persistent_heads(&r.kp), works = fa_persistent_works(&r.kp, heads);
            const int32_t rounds = (works + caps.sm_count - 1) / caps.sm_count;
            std::vector<int> taken(r.grid_x, 0);
            for (int32_t b = 0; b < r.grid_x; ++b)
                for (int32_t w = fa_persistent_first(&r.kp, heads, b, r.grid_x); w < works;
                     w = fa_persistent_next(&r.kp, heads, w, b, r.grid_x))
                    ++taken[b];
            EXPECT_EQ(rounds, *std::max_element(taken.begin(), taken.end())) << batch;
            EXPECT_GE(*std::min_element(taken.begin(), taken.end()), rounds - 1) << batch;
            EXPECT_EQ(works, std::accumulate(taken.begin(), taken.end(), 0)) << batch;
        }
        {
            // A call that appends (a cache with device lengths, a new key each) keeps one block an SM.
            flashattn_fwd_params cache = dec;
            cache.batch = 17;
            flashattn_fwd_params_set_packed_strides(&cache);
            cache.seqused_k = (const int32_t *)0x710000;
            flashattn_fwd_params a = cache;
            a.k_new = (const void *)0x740000, a.v_new = (const void *)0x750000, a.seqlen_new = 1;
            a.k_new_head_stride = a.v_new_head_stride = 128, a.k_new_seq_stride = a.v_new_seq_stride = 8 * 128;
            a.k_new_batch_stride = a.v_new_batch_stride = 8 * 128;
            const fa_plan r = plan_ok(a, caps);
            EXPECT_EQ(1, r.kp.persistent);
            EXPECT_EQ(132, r.grid_x);
            EXPECT_EQ(68, plan_ok(cache, caps).grid_x);  // the same cache read without an append
        }
        dec.batch = 16, dec.seqlen_q = 1, dec.mask = FLASHATTN_MASK_NONE;  // 128 tiles: a block each
        flashattn_fwd_params_set_packed_strides(&dec);
        const fa_plan few = plan_ok(dec, caps);
        EXPECT_EQ(0, few.kp.persistent);
        EXPECT_EQ(0, few.kp.serving);
        EXPECT_EQ(1, few.kp.pack_gqa);
    }
    // Serving calls are planned on their capacities: 3 x 8 heads x 100 queries is 24 tiles; 3 x 8
    // heads x 2000 is 384. TMA-read pages, packed K/V and caches go persistent; so do gathered pages
    // (a size TMA cannot tile) under a causal mask where the resident block has two consumers and two
    // Q buffers (its record warp copies rows too); unmasked, or on other tiles, they keep a block a
    // tile.
    v.seqlen_q = 2000, v.seqlen_k = 2000, v.pages_per_seq = 125, v.block_table_batch_stride = 125, v.num_pages = 375;
    v.total_q = 6000;
    EXPECT_EQ(1, persistent(v));
    const fa_plan served = plan_ok(v, caps);
    fa_plan_describe(&served, &info);
    EXPECT_NE(std::string(info.description).find(" persistent"), std::string::npos) << info.description;
    EXPECT_EQ(132, served.grid_x);
    // A serving block has an O tile and two Q buffers, and 128 bytes more of barriers for its two
    // 64-byte tile records; the launcher refuses a plan whose figure differs from the kernel's.
    EXPECT_EQ(fa_sm90_smem_bytes(served.cfg.head_dim, served.cfg.block_m, served.cfg.block_n, 1, 1), served.smem_bytes);
    EXPECT_EQ(1024 + 2 * served.cfg.head_dim * (served.cfg.block_m + 4 * served.cfg.block_n) + 128 +
                  2 * (2 * served.cfg.head_dim * served.cfg.block_m) + 128,
              served.smem_bytes);
    v.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    EXPECT_EQ(2, persistent(v));
    v.page_size = 1, v.pages_per_seq = 2000, v.block_table_batch_stride = 2000, v.num_pages = 6000;
    v.k_batch_stride = v.v_batch_stride = v.k_seq_stride;
    EXPECT_EQ(2, persistent(v));  // gathered, on resident blocks (head dim 128: two consumers, 128-key tiles)
    EXPECT_EQ(1, plan_ok(v, caps).kp.gather_pages);
    EXPECT_EQ(0, plan_ok(v, caps).kp.sched_heads);
    // Which resident serving blocks gather: 128 query rows and room for two Q buffers beside an O
    // tile and four K/V stages (head dims 64 and 128 on 128-key tiles); not the 192-row tile, the
    // 176-key tile, head dims 192 or 256.
    EXPECT_EQ(1, fa_sm90_resident_gathers(128, 128, 128));
    EXPECT_EQ(1, fa_sm90_resident_gathers(64, 128, 128));
    EXPECT_EQ(0, fa_sm90_resident_gathers(64, 192, 128));
    EXPECT_EQ(0, fa_sm90_resident_gathers(128, 128, 176));
    EXPECT_EQ(0, fa_sm90_resident_gathers(192, 128, 112));
    EXPECT_EQ(0, fa_sm90_resident_gathers(256, 128, 80));
    v.mask = FLASHATTN_MASK_NONE;
    EXPECT_EQ(0, persistent(v));  // gathered and unmasked: a block a tile
    v.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, v.window_left = 100;
    EXPECT_EQ(0, persistent(v));  // gathered under a window: a block a tile
    flashattn_fwd_params w = valid_varlen_packed();
    w.backend = FLASHATTN_BACKEND_FUSED_SM90, w.seqlen_q = w.seqlen_k = 2000, w.total_q = w.total_k = 6000;
    EXPECT_EQ(1, persistent(w));
    w.window_left = 100;
    EXPECT_EQ(1, persistent(w));
}

// The work numbers of persistent blocks: every tile exactly once across the blocks, every block
// with work. Under pairs, a block's units hold one heavy and one light tile whose work (m_block + 1
// key tiles when block_m = block_n) sums to the same for every unit; with an odd tile count the
// middle tiles come after the units, first to the blocks with one unit fewer, so that the most and
// least loaded blocks differ by at most one unit's work (m + 1). fa_persistent_work gives each
// tile's work number back. With packed query heads (pack_gqa) the pairs are of KV heads.
TEST(Planning, PersistentWorkCoversEveryTileOnce) {
    for (int kind : {1, 2})
        for (int pack : {0, 1})
        for (auto [m, batch, heads, grid] : std::vector<std::array<int, 4>>{{1, 1, 1, 1},   {4, 32, 16, 132}, {5, 3, 7, 13},
                                                                            {7, 2, 3, 132}, {11, 8, 32, 132}, {64, 2, 16, 132},
                                                                            {3, 1, 200, 100}, {1, 300, 1, 132}, {3, 9, 7, 50}}) {
            fa_kernel_params kp{};
            kp.num_m_blocks = m, kp.batch = batch, kp.persistent = kind, kp.pack_gqa = pack;
            kp.heads_kv = heads, kp.heads_q = pack ? 4 * heads : heads;  // (packed: groups of 4 query heads)
            const int64_t pairs = (int64_t)batch * heads;
            if (kind == 2) grid = (int)std::min<int64_t>(grid, (m / 2 + m % 2) * pairs);  // as the planner caps it
            else grid = (int)std::min<int64_t>(grid, m * pairs);
            std::vector<int> seen(pairs * m, 0);
            const int32_t tile_heads = fa_persistent_heads(&kp), works = fa_persistent_works(&kp, tile_heads);
            ASSERT_EQ(heads, tile_heads);
            EXPECT_EQ(m * pairs, works);
            int64_t most = 0, least = INT64_MAX;
            for (int32_t block = 0; block < grid; ++block) {
                int32_t prev_m = -1;
                int64_t load = 0;
                ASSERT_LT(fa_persistent_first(&kp, tile_heads, block, grid), works) << "block " << block << " has no work";
                for (int32_t w = fa_persistent_first(&kp, tile_heads, block, grid), k = 0; w < works;
                     w = fa_persistent_next(&kp, tile_heads, w, block, grid), ++k) {
                    int32_t mb = -1, bh = -1;
                    fa_persistent_tile(&kp, tile_heads, w, &mb, &bh);
                    ASSERT_TRUE(mb >= 0 && mb < m && bh >= 0 && bh < pairs) << w;
                    ASSERT_EQ(w, fa_persistent_work(&kp, tile_heads, mb, bh)) << "kind " << kind << " m " << m << " tile " << mb;
                    ++seen[bh * m + mb];
                    load += mb + 1;
                    if (kind == 2 && w < 2 * (m / 2) * pairs) {
                        if (k % 2 == 0) prev_m = mb;
                        else EXPECT_EQ(m - 1, prev_m + mb) << "a unit's two tiles are m - 1 apart";
                    }
                }
                most = std::max(most, load), least = std::min(least, load);
            }
            for (int64_t i = 0; i < pairs * m; ++i) ASSERT_EQ(1, seen[i]) << "kind " << kind << " m " << m << " tile " << i;
            if (kind == 2) EXPECT_LE(most - least, m + 1) << "m " << m << " pairs " << pairs << " grid " << grid;
        }
}

// Causal calls on FUSED_SM90 run their heaviest query tiles first across sections of heads whose K
// and V fit two thirds of the L2; other calls keep the grid order. The order is a permutation of
// the tiles: every (m_block, batch x head) pair exactly once.
TEST(Planning, Sm90CausalCallsRunHeaviestTilesFirstAcrossHeads) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    flashattn_fwd_params p = valid_params();
    // One query tile more than keys: its rows see no key, so a block a tile (not persistent).
    p.batch = 2, p.seqlen_q = 8192 + 128, p.seqlen_k = 8192, p.heads_q = p.heads_kv = 16, p.head_dim = 128;
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    flashattn_fwd_params_set_packed_strides(&p);
    fa_device_caps caps = h200_caps();
    caps.l2_bytes = 50LL << 20;
    fa_plan plan = plan_ok(p, caps);
    ASSERT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(8, plan.kp.sched_heads);  // 4 MiB of K and V per head; 33.3 MB / 4 MiB
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    fa_plan_describe(&plan, &info);
    EXPECT_NE(std::string(info.description).find(" heaviest_first=8"), std::string::npos) << info.description;
    p.heads_kv = 4;  // a KV head's K and V serve four query heads
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(32, plan_ok(p, caps).kp.sched_heads);
    caps.l2_bytes = 0;  // unknown: 50 MB assumed
    EXPECT_EQ(32, plan_ok(p, caps).kp.sched_heads);
    p.seqlen_q = 32 * 128, p.seqlen_k = 31 * 128;  // 32 query tiles a head: the least that takes the order
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(32, plan_ok(p, caps).kp.sched_heads);
    p.seqlen_q = 31 * 128, p.seqlen_k = 30 * 128;  // fewer: the grid order (its blocks share a few heads' K and V)
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(0, plan_ok(p, caps).kp.sched_heads);
    p.batch = 1, p.seqlen_q = 4096, p.seqlen_k = 1 << 20, p.heads_kv = p.heads_q;  // 512 MiB a head: sections of one
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(1, fa_sched_heads(&caps, &p, 32));
    p.window_left = 256, p.window_right = 0, p.mask = FLASHATTN_MASK_NONE;  // a right window: tiles differ too
    EXPECT_EQ(1, plan_ok(p, caps).kp.sched_heads);
    p.window_left = -1, p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;  // sq > sk: rows that see no key
    p.seqlen_q = 16384, p.seqlen_k = 8192, p.window_right = -1;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(0, plan_ok(p, caps).kp.persistent);
    EXPECT_EQ(8, plan_ok(p, caps).kp.sched_heads);  // 4 MiB of K and V a head
    p.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT, p.seqlen_q = 4096;  // persistent pairs instead
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(2, plan_ok(p, caps).kp.persistent);
    EXPECT_EQ(0, plan_ok(p, caps).kp.sched_heads);
    p.mask = FLASHATTN_MASK_NONE;  // no mask: every tile the same work, the grid order
    plan = plan_ok(p, caps);
    EXPECT_EQ(0, plan.kp.sched_heads);
    fa_plan_describe(&plan, &info);
    EXPECT_EQ(std::string(info.description).find("heaviest_first"), std::string::npos) << info.description;
    // Split or packed calls (decode) and serving calls keep the grid order.
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, p.seqlen_q = 1, p.heads_kv = 4;
    flashattn_fwd_params_set_packed_strides(&p);
    plan = plan_ok(p, caps);
    EXPECT_TRUE(plan.kp.num_splits > 1 || plan.kp.pack_gqa);
    EXPECT_EQ(0, plan.kp.sched_heads);
    flashattn_fwd_params v = valid_varlen_paged();
    v.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, v.backend = FLASHATTN_BACKEND_FUSED_SM90;
    EXPECT_EQ(0, plan_ok(v, caps).kp.sched_heads);
    // The FUSED backend keeps the grid order.
    p = valid_params();
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, p.backend = FLASHATTN_BACKEND_FUSED;
    EXPECT_EQ(0, plan_ok(p, caps).kp.sched_heads);

    // fa_sched_tile: a bijection, sections in order, heaviest first within each.
    for (auto [m, batch, heads, sec] : std::vector<std::array<int, 4>>{
             {1, 1, 1, 1}, {4, 3, 5, 4}, {7, 2, 16, 8}, {128, 1, 16, 4}, {3, 1, 7, 32}, {5, 2, 3, 1}, {64, 4, 32, 6}}) {
        fa_kernel_params kp{};
        kp.num_m_blocks = m, kp.batch = batch, kp.heads_q = heads, kp.sched_heads = sec;
        const int64_t pairs = (int64_t)batch * heads, n = pairs * m;
        std::vector<int> seen(n, 0);
        int64_t prev_bh_section = 0;
        int32_t prev_m = m;
        for (int64_t L = 0; L < n; ++L) {
            int32_t mb = -1;
            int64_t bh = -1;
            fa_sched_tile(&kp, L, &mb, &bh);
            ASSERT_TRUE(mb >= 0 && mb < m && bh >= 0 && bh < pairs) << L << " -> " << mb << ", " << bh;
            ++seen[bh * m + mb];
            const int64_t section = bh / sec;
            ASSERT_GE(section, prev_bh_section) << "sections run in order";
            if (section == prev_bh_section) ASSERT_LE(mb, prev_m) << "heaviest first within a section";
            prev_bh_section = section, prev_m = mb;
        }
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(1, seen[i]) << "tile " << i << " of m " << m << " pairs " << pairs;
    }
}

TEST(Planning, FusedDecodeRunsAGroupsQueryHeadsAsTheRowsOfOneTile) {
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    // One query row per sequence, 32 query heads over 8 KV heads, on a GPU where FUSED runs: the
    // 4 heads of a group are the 4 rows of one tile (Q's and O's head stride read as the position
    // stride), one block per KV head; the LSE layout is unchanged.
    flashattn_fwd_params p = valid_params();
    p.batch = 3, p.seqlen_q = 1, p.seqlen_k = 4096, p.heads_q = 32, p.heads_kv = 8, p.head_dim = 128;
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, p.window_right = 0;
    flashattn_fwd_params_set_packed_strides(&p);
    const fa_plan plan = plan_ok(p, a100_caps());
    ASSERT_EQ(FLASHATTN_BACKEND_FUSED, plan.backend);
    EXPECT_EQ(1, plan.gqa_rows);
    EXPECT_EQ(8, plan.grid_y);
    EXPECT_EQ(3, plan.grid_z);
    EXPECT_EQ(9, plan.kp.num_splits);  // 24 blocks for 2 x 108 resident: the keys split 9 ways
    EXPECT_EQ(9, plan.grid_x);
    EXPECT_EQ(4, plan.kp.seqlen_q);
    EXPECT_EQ(1, plan.kp.head_group);
    EXPECT_EQ(128, plan.kp.q_seq_stride);
    EXPECT_EQ(4 * 128, plan.kp.q_head_stride);
    EXPECT_EQ(p.q_batch_stride, plan.kp.q_batch_stride);
    EXPECT_EQ(128, plan.kp.o_seq_stride);
    EXPECT_EQ(4 * 128, plan.kp.o_head_stride);
    EXPECT_EQ(-4, plan.kp.key_lo_off);  // every row sees every key
    EXPECT_EQ(4096, plan.kp.key_hi_off);
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    fa_plan_describe(&plan, &info);
    EXPECT_NE(std::string(info.description).find("gqa_rows"), std::string::npos) << info.description;
    // Where a row's visible keys or bias depend on its position, or Q is rotated: one head per block.
    const std::vector<std::function<void(flashattn_fwd_params &)>> position_dependent = {
        [](auto &q) { q.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT; },
        [](auto &q) { q.window_left = 100; },
        [](auto &q) { q.alibi_slopes = (const float *)0x500000; },
        [](auto &q) { q.seqlen_q = 2; },
        [](auto &q) { q.heads_kv = 32; },
    };
    for (const auto &change : position_dependent) {
        flashattn_fwd_params c = p;
        change(c);
        flashattn_fwd_params_set_packed_strides(&c);
        const fa_plan other = plan_ok(c, a100_caps());
        EXPECT_EQ(0, other.gqa_rows);
        EXPECT_EQ(c.heads_q, other.grid_y);
    }
    // FUSED_SM90 packs its own way (pack_gqa); the re-read is FUSED's.
    if (fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) EXPECT_EQ(0, plan_ok(p, h200_caps()).gqa_rows);

    // A packed Q of one query per sequence (varlen decode) is read the same way: each sequence's
    // query as 4 rows (q_group_rows), its packed row from the real row strides; the same grid and
    // splits as the dense call.
    flashattn_fwd_params r = p;
    r.cu_seqlens_q = (const int32_t *)0x700000, r.total_q = 3;
    r.q_batch_stride = r.o_batch_stride = 0;
    const fa_plan packed = plan_ok(r, a100_caps());
    EXPECT_EQ(1, packed.gqa_rows);
    EXPECT_EQ(4, packed.kp.q_group_rows);
    EXPECT_EQ(32 * 128, packed.kp.q_row0_stride);
    EXPECT_EQ(32 * 128, packed.kp.o_row0_stride);
    EXPECT_EQ(128, packed.kp.q_seq_stride);
    EXPECT_EQ(4 * 128, packed.kp.q_head_stride);
    EXPECT_EQ(plan.grid_x, packed.grid_x);
    EXPECT_EQ(plan.grid_y, packed.grid_y);
    EXPECT_EQ(plan.kp.num_splits, packed.kp.num_splits);
    EXPECT_EQ(plan.workspace_bytes, packed.workspace_bytes);
    EXPECT_EQ(0, plan.kp.q_group_rows);  // the dense re-read needs none of it
    r.seqlen_q = 2;  // a sequence may have two queries: one head per block
    EXPECT_EQ(0, plan_ok(r, a100_caps()).gqa_rows);
    // An empty packed Q (no rows) may have any strides, since none is used; one whose head stride
    // times the group overflows int64 is not re-read (the fuzzer's input: the product overflowed).
    for (int64_t huge : {INT64_MAX - 151, INT64_MAX / 4 + 1}) {
        flashattn_fwd_params e = p;
        e.cu_seqlens_q = (const int32_t *)0x700000, e.total_q = 0;
        e.q_batch_stride = e.o_batch_stride = 0, e.q_head_stride = huge;
        EXPECT_EQ(0, plan_ok(e, a100_caps()).gqa_rows) << huge;
        e.q_head_stride = 128, e.o_head_stride = huge;
        EXPECT_EQ(0, plan_ok(e, a100_caps()).gqa_rows) << huge;
        e.o_head_stride = 128;  // the same call with strides that fit is re-read
        EXPECT_EQ(1, plan_ok(e, a100_caps()).gqa_rows);
    }
}

TEST(Planning, FusedBlocksWithRowlessWarpsTakeTheIdleWarpKernel) {
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    // FUSED blocks hold block_m rows, block_m / warps a warp. Where no block can hold more rows than
    // leave a warp empty (a decode's grouped heads, a few queries), the plan takes the kernel whose
    // rowless warps skip the matrix products, and says how many such warps a block has at least.
    flashattn_fwd_params p = valid_params();
    p.batch = 3, p.seqlen_q = 1, p.seqlen_k = 4096, p.heads_q = 32, p.heads_kv = 8, p.head_dim = 128;
    flashattn_fwd_params_set_packed_strides(&p);
    auto idle = [](flashattn_fwd_params q) {
        flashattn_fwd_params_set_packed_strides(&q);
        const fa_plan plan = plan_ok(q, a100_caps());
        EXPECT_EQ(FLASHATTN_BACKEND_FUSED, plan.backend);
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        fa_plan_describe(&plan, &info);
        const std::string want = " idle_warps=" + std::to_string(plan.kp.idle_warps);
        EXPECT_EQ(plan.kp.idle_warps > 0, std::string(info.description).find(want) != std::string::npos)
            << info.description;
        return plan.kp.idle_warps;
    };
    EXPECT_EQ(3, idle(p));  // 4 grouped heads: rows 0-3 of 128, 32 a warp
    flashattn_fwd_params c = p;
    c.heads_q = 8 * 12;  // 12 rows: still one warp's
    EXPECT_EQ(3, idle(c));
    c.heads_q = 8 * 40;  // 40 rows: two warps'
    EXPECT_EQ(2, idle(c));
    c = p, c.heads_kv = 32, c.seqlen_q = 96;  // no grouping: 96 rows, the fourth warp rowless
    EXPECT_EQ(1, idle(c));
    c.seqlen_q = 97;  // a row for every warp
    EXPECT_EQ(0, idle(c));
    c.seqlen_q = 300;  // three tiles
    EXPECT_EQ(0, idle(c));
    c = p, c.softcap = 30.0f;  // with softcap too
    EXPECT_EQ(3, idle(c));
    c = p, c.alibi_slopes = (const float *)0x500000;  // and ALiBi (one head a block, one row of 128)
    EXPECT_EQ(3, idle(c));
    if (fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 256)) {
        c = p, c.head_dim = 256;  // 64-row tiles, 16 rows a warp
        EXPECT_EQ(3, idle(c));
        c.heads_q = 8 * 40;
        EXPECT_EQ(1, idle(c));
    }
    c = p, c.mask = FLASHATTN_MASK_CAUSAL_TOP_LEFT;  // one head a block, one row of 128
    EXPECT_EQ(3, idle(c));
    // A packed Q of one query per sequence (varlen decode): the capacity's rows, as the dense call.
    c = p;
    c.cu_seqlens_q = (const int32_t *)0x700000, c.total_q = 3;
    c.q_batch_stride = c.o_batch_stride = 0;
    const fa_plan packed = plan_ok(c, a100_caps());
    EXPECT_EQ(3, packed.kp.idle_warps);
    // FUSED_SM90 has no such kernel.
    if (fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) EXPECT_EQ(0, plan_ok(p, h200_caps()).kp.idle_warps);
}

TEST(Planning, PackGqaDecision) {
    EXPECT_TRUE(fa_should_pack_gqa(1, 4, 128, 1));     // decode, 4 query heads per KV head
    EXPECT_TRUE(fa_should_pack_gqa(1, 4, 128, 64));    // Sq = block_m / 2 still packs
    EXPECT_FALSE(fa_should_pack_gqa(1, 4, 128, 65));   // more rows: ordinary tiles are full enough
    EXPECT_FALSE(fa_should_pack_gqa(1, 1, 128, 1));    // no grouping: nothing to share
    EXPECT_FALSE(fa_should_pack_gqa(1, 256, 128, 1));  // a group larger than a tile
    EXPECT_TRUE(fa_should_pack_gqa(1, 128, 128, 1));
    EXPECT_FALSE(fa_should_pack_gqa(0, 4, 128, 1));    // FUSED never packs
}

TEST(Planning, NumSplitsFillsOneWave) {
    EXPECT_EQ(16, fa_num_splits(132, 8, 64));   // 8 tiles: 132 / 8 = 16 splits fit one wave
    EXPECT_EQ(4, fa_num_splits(132, 8, 8));     // at least 2 key tiles per split
    EXPECT_EQ(1, fa_num_splits(132, 8, 3));     // one split of 2+ tiles would be all of them
    EXPECT_EQ(64, fa_num_splits(132, 1, 1024)); // at most FA_MAX_SPLITS
    EXPECT_EQ(1, fa_num_splits(132, 132, 1024)); // the tiles fill the GPU already
    EXPECT_EQ(1, fa_num_splits(132, 67, 1024)); // 132 / 67 = 1: no room for a second split
    EXPECT_EQ(1, fa_num_splits(132, 0, 1024));  // nothing to run (Sq = 0)
    // FUSED's slots: SMs x the blocks an SM holds (registers: two of 4 warps; then shared memory).
    const fa_device_caps h200 = h200_caps(), a100 = a100_caps(), ada = {0, 8, 9, 142, 101376, 0};
    const fa_fused_config d128 = *fa_fused_config_for(128), d256 = *fa_fused_config_for(256);
    EXPECT_EQ(2, fa_fused_blocks_per_sm(&h200, &d128));
    EXPECT_EQ(2, fa_fused_blocks_per_sm(&a100, &d128));
    EXPECT_EQ(1, fa_fused_blocks_per_sm(&ada, &d128));  // 99 KB an SM: one 68 KB block
    EXPECT_EQ(2, fa_fused_blocks_per_sm(&h200, &d256));
    EXPECT_EQ(1, fa_fused_blocks_per_sm(&a100, &d256));
}

TEST(Planning, Sm90HeadDim64UsesTwoConsumersForShortMaskedCalls) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 64)) GTEST_SKIP() << "no FUSED_SM90 d64 in this build";
    flashattn_fwd_params p = valid_params();
    p.head_dim = 64, p.seqlen_q = p.seqlen_k = 512;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(192, plan_ok(p, h200_caps()).cfg.block_m);  // unmasked: three consumer warpgroups
    p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    fa_plan plan = plan_ok(p, h200_caps());
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(128, plan.cfg.block_m);                      // short and causal: two
    EXPECT_EQ(384, plan.threads);
    EXPECT_EQ(fa_sm90_smem_bytes(64, 128, plan.cfg.block_n, 0, 0), plan.smem_bytes);
    p.mask = FLASHATTN_MASK_NONE, p.window_left = 100;
    EXPECT_EQ(128, plan_ok(p, h200_caps()).cfg.block_m);  // windows count as masks
    p.seqlen_q = p.seqlen_k = 2048;
    flashattn_fwd_params_set_packed_strides(&p);
    plan = plan_ok(p, h200_caps());
    EXPECT_EQ(192, plan.cfg.block_m);                      // long: three
    EXPECT_EQ(512, plan.threads);
    EXPECT_EQ(11, plan.kp.num_m_blocks);
    EXPECT_EQ(1, plan.kp.persistent);  // 176 tiles, 11 a head, each row seeing keys: resident blocks
    EXPECT_EQ(132, plan.grid_x);
    // Decode-shaped, unmasked: a KV group's 4 query rows fill less than one consumer's 64, so one
    // consumer (with 192-key tiles); more rows than that, two.
    p.window_left = -1, p.seqlen_q = 1, p.heads_q = 32, p.heads_kv = 8;
    flashattn_fwd_params_set_packed_strides(&p);
    plan = plan_ok(p, h200_caps());
    EXPECT_EQ(64, plan.cfg.block_m);
    EXPECT_EQ(192, plan.cfg.block_n);
    EXPECT_EQ(1, plan.kp.pack_gqa);
    p.seqlen_q = 64;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(128, plan_ok(p, h200_caps()).cfg.block_m);
    p.seqlen_q = 65;  // more rows: the three-consumer tile again (unmasked)
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(192, plan_ok(p, h200_caps()).cfg.block_m);
}

TEST(Planning, AutoUsesTheSm90RangesOfTheTable) {
    EXPECT_TRUE(fa_sm90_auto_prefers(64));
    EXPECT_TRUE(fa_sm90_auto_prefers(40));
    EXPECT_FALSE(fa_sm90_auto_prefers(32));   // d32 has its own FUSED variant
    EXPECT_TRUE(fa_sm90_auto_prefers(128));
    EXPECT_TRUE(fa_sm90_auto_prefers(104));
    EXPECT_TRUE(fa_sm90_auto_prefers(96));    // measured: the d128 variant beats FUSED's d96
    EXPECT_TRUE(fa_sm90_auto_prefers(160));   // and the d256 variant FUSED's d160 and d192
    EXPECT_TRUE(fa_sm90_auto_prefers(256));
    EXPECT_FALSE(fa_sm90_auto_prefers(264));
    EXPECT_EQ(64, fa_sm90_kernel_head_dim(8));
    EXPECT_EQ(128, fa_sm90_kernel_head_dim(72));
    EXPECT_EQ(256, fa_sm90_kernel_head_dim(200));
    EXPECT_EQ(0, fa_sm90_kernel_head_dim(264));
}

TEST(Planning, HeadDimsRoundUpToACompiledVariant) {
    EXPECT_EQ(32, fa_fused_kernel_head_dim(8));
    EXPECT_EQ(64, fa_fused_kernel_head_dim(40));
    EXPECT_EQ(96, fa_fused_kernel_head_dim(72));
    EXPECT_EQ(96, fa_fused_kernel_head_dim(80));
    EXPECT_EQ(256, fa_fused_kernel_head_dim(200));
    EXPECT_EQ(256, fa_fused_kernel_head_dim(224));
    EXPECT_EQ(0, fa_fused_kernel_head_dim(264));
}

TEST(Planning, OddHeadDimFallsBackToReference) {
    flashattn_fwd_params p = valid_params();
    p.head_dim = 36;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, plan_ok(p, h200_caps()).backend);
    p.backend = FLASHATTN_BACKEND_FUSED;
    fa_plan plan;
    const fa_device_caps caps = h200_caps();
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&caps, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("multiple of 8"), std::string::npos);
}

TEST(Planning, UnalignedTensorsFallBackToReference) {
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    flashattn_fwd_params p = valid_params();
    p.k = (const char *)p.k + 2;  // element-aligned, not 16-byte aligned
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, plan_ok(p, h200_caps()).backend);
    p = valid_params();
    p.q_seq_stride += 4;  // not a multiple of 8 elements
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, plan_ok(p, h200_caps()).backend);
    p.backend = FLASHATTN_BACKEND_FUSED;
    fa_plan plan;
    const fa_device_caps caps = h200_caps();
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&caps, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("stride"), std::string::npos);
}

TEST(Planning, SharedMemoryLimitOfTheDevice) {
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    flashattn_fwd_params p = valid_params();
    const fa_fused_config *cfg = fa_fused_config_for(128);
    ASSERT_NE(nullptr, cfg);
    fa_device_caps small = h200_caps();
    small.smem_per_block_optin = fa_fused_smem_bytes(cfg) - 1;
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, plan_ok(p, small).backend);
    p.backend = FLASHATTN_BACKEND_FUSED;
    fa_plan plan;
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&small, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("shared memory"), std::string::npos);
}

TEST(Planning, DeviceTooOld) {
    flashattn_fwd_params p = valid_params();
    fa_device_caps turing = {0, 7, 5, 40, 65536};
    fa_plan plan;
    EXPECT_EQ(FLASHATTN_STATUS_DEVICE_TOO_OLD, fa_plan_make(&turing, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("7.5"), std::string::npos);
}

TEST(Planning, ReferenceWorkspaceCoversEveryRegion) {
    flashattn_fwd_params p = valid_params();
    p.backend = FLASHATTN_BACKEND_REFERENCE;
    const fa_plan plan = plan_ok(p, h200_caps());
    EXPECT_EQ(FLASHATTN_BACKEND_REFERENCE, plan.backend);
    const int64_t nbh = 2 * 8;
    EXPECT_GE(plan.ref.scores - plan.ref.ptr_arrays, 6 * nbh * 8);
    EXPECT_GE(plan.ref.v_f32 - plan.ref.scores, nbh * 100 * 200 * 4);
    EXPECT_GE(plan.ref.o_f32 - plan.ref.v_f32, 2 * 2 * 200 * 128 * 4);
    EXPECT_GE(plan.ref.cublas_ws - plan.ref.o_f32, nbh * 100 * 128 * 4);
    EXPECT_EQ(plan.ref.cublas_ws + FA_CUBLAS_WORKSPACE_BYTES, plan.ref.total);
    EXPECT_EQ(plan.ref.total, plan.workspace_bytes);
    for (int64_t off : {plan.ref.scores, plan.ref.v_f32, plan.ref.o_f32, plan.ref.cublas_ws})
        EXPECT_EQ(0, off % FA_WORKSPACE_ALIGN);
}

TEST(Planning, ReferenceRejectsHugeWorkspaceAndOddLeadingDims) {
    flashattn_fwd_params p = valid_params();
    p.backend = FLASHATTN_BACKEND_REFERENCE;
    p.seqlen_q = p.seqlen_k = (int64_t)1 << 30;
    p.batch = 1 << 20;
    flashattn_fwd_params_set_packed_strides(&p);
    fa_plan plan;
    const fa_device_caps caps = h200_caps();
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&caps, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("overflow"), std::string::npos);
    p = valid_params();
    p.backend = FLASHATTN_BACKEND_REFERENCE;
    p.k_seq_stride = 64;  // < head_dim: cuBLAS cannot take it as a leading dimension
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&caps, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("k_seq_stride"), std::string::npos);
}

TEST(Planning, EmptyQueryIsANoOp) {
    flashattn_fwd_params p = valid_params();
    p.seqlen_q = 0;
    const fa_plan plan = plan_ok(p, h200_caps());
    EXPECT_TRUE(plan.noop);
    EXPECT_EQ(0, plan.workspace_bytes);
}

TEST(Planning, VisibilityOffsets) {
    struct Case { int mask; int64_t sq, sk, wl, wr; int lo, hi; };
    const Case cases[] = {
        {FLASHATTN_MASK_NONE, 100, 200, -1, -1, -100, 200},
        {FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 100, 200, -1, -1, -100, 100},
        {FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 200, 100, -1, -1, -200, -100},
        {FLASHATTN_MASK_CAUSAL_TOP_LEFT, 100, 200, -1, -1, -100, 0},
        {FLASHATTN_MASK_NONE, 100, 200, 16, 4, 84, 104},
        {FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT, 100, 200, 16, 4, 84, 100},
        {FLASHATTN_MASK_NONE, 100, 200, INT64_MAX, INT64_MAX, -100, 200},
        {FLASHATTN_MASK_NONE, 10, 10, 0, 0, 0, 0},
    };
    for (const Case &c : cases) {
        flashattn_fwd_params p = valid_params();
        p.mask = c.mask, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.window_left = c.wl, p.window_right = c.wr;
        flashattn_fwd_params_set_packed_strides(&p);
        const fa_plan plan = plan_ok(p, h200_caps());
        EXPECT_EQ(c.lo, plan.kp.key_lo_off) << c.mask << " " << c.sq << " " << c.sk << " " << c.wl;
        EXPECT_EQ(c.hi, plan.kp.key_hi_off) << c.mask << " " << c.sq << " " << c.sk << " " << c.wr;
    }
}

TEST(Planning, ScaleDefaultAndFold) {
    flashattn_fwd_params p = valid_params();
    fa_plan plan = plan_ok(p, h200_caps());
    EXPECT_FLOAT_EQ(1.0f / std::sqrt(128.0f), plan.kp.scale);
    EXPECT_FLOAT_EQ(plan.kp.scale * 1.4426950408889634f, plan.kp.scale_log2);
    p.softmax_scale = 0.5f;
    p.softcap = 30.0f;
    plan = plan_ok(p, h200_caps());
    EXPECT_FLOAT_EQ(0.5f, plan.kp.scale);
    EXPECT_FLOAT_EQ(0.5f / 30.0f, plan.kp.softcap_inv_scale);
}

TEST(Planning, DescribeNamesKernelAndGrid) {
    flashattn_fwd_params p = valid_params();
    const fa_plan plan = plan_ok(p, h200_caps());
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    fa_plan_describe(&plan, &info);
    EXPECT_EQ(sizeof info, info.struct_size);
    EXPECT_EQ(plan.backend, info.backend);
    EXPECT_EQ(plan.grid_x, info.grid_x);
    EXPECT_EQ(plan.kp.num_splits > 1 ? plan.kp.num_splits : 1, info.num_splits);
    // FUSED_SM90's tiles fill the H200 unsplit (a build without it plans FUSED, which splits).
    if (fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) EXPECT_EQ(1, info.num_splits);
    const std::string d = info.description;
    EXPECT_NE(d.find(info.kernel_name), std::string::npos) << d;
    EXPECT_NE(d.find("grid=("), std::string::npos) << d;
    EXPECT_NE(d.find("workspace="), std::string::npos) << d;
}

// ---- struct growth: older (smaller) structs keep working; unknown sizes are refused ----------------

// The 0.1.0 layout, field by field, frozen: what an application built against 0.1.0 passes.
struct fwd_params_0_1 {
    size_t struct_size;
    int32_t dtype, mask, backend, reserved0;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    const void *q;
    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    const void *k;
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    const void *v;
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    void *o;
    int64_t o_batch_stride, o_seq_stride, o_head_stride;
    float *lse;
    float softmax_scale, softcap;
    int64_t window_left, window_right;
    const float *alibi_slopes;
    int64_t alibi_batch_stride;
};
static_assert(sizeof(fwd_params_0_1) == FLASHATTN_FWD_PARAMS_SIZE_0_1, "0.1.0 size");
#define SAME_OFFSET(f) static_assert(offsetof(fwd_params_0_1, f) == offsetof(flashattn_fwd_params, f), #f " moved")
SAME_OFFSET(struct_size); SAME_OFFSET(dtype); SAME_OFFSET(mask); SAME_OFFSET(backend); SAME_OFFSET(reserved0);
SAME_OFFSET(batch); SAME_OFFSET(seqlen_q); SAME_OFFSET(seqlen_k); SAME_OFFSET(heads_q); SAME_OFFSET(heads_kv);
SAME_OFFSET(head_dim); SAME_OFFSET(q); SAME_OFFSET(q_batch_stride); SAME_OFFSET(q_seq_stride);
SAME_OFFSET(q_head_stride); SAME_OFFSET(k); SAME_OFFSET(k_batch_stride); SAME_OFFSET(k_seq_stride);
SAME_OFFSET(k_head_stride); SAME_OFFSET(v); SAME_OFFSET(v_batch_stride); SAME_OFFSET(v_seq_stride);
SAME_OFFSET(v_head_stride); SAME_OFFSET(o); SAME_OFFSET(o_batch_stride); SAME_OFFSET(o_seq_stride);
SAME_OFFSET(o_head_stride); SAME_OFFSET(lse); SAME_OFFSET(softmax_scale); SAME_OFFSET(softcap);
SAME_OFFSET(window_left); SAME_OFFSET(window_right); SAME_OFFSET(alibi_slopes); SAME_OFFSET(alibi_batch_stride);
#undef SAME_OFFSET
static_assert(sizeof(flashattn_fwd_params) >= FLASHATTN_FWD_PARAMS_SIZE_0_1, "the struct only grows");
static_assert(sizeof(flashattn_plan_info) >= FLASHATTN_PLAN_INFO_SIZE_0_1, "the struct only grows");

// `bytes` of memory that end exactly at an inaccessible page: reading or writing one byte past them
// faults, so a test passes only if the library stays within the size it was given.
class GuardedBytes {
  public:
    explicit GuardedBytes(size_t bytes) : page_((size_t)sysconf(_SC_PAGESIZE)) {
        base_ = (char *)mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        EXPECT_NE(MAP_FAILED, (void *)base_);
        EXPECT_EQ(0, mprotect(base_ + page_, page_, PROT_NONE));
        EXPECT_EQ(0u, bytes % 8);
        ptr_ = base_ + page_ - bytes;
    }
    ~GuardedBytes() { munmap(base_, 2 * page_); }
    template <class T> T *as() { return reinterpret_cast<T *>(ptr_); }

  private:
    size_t page_;
    char *base_, *ptr_;
};

// A handle for a synthetic device: the planning queries need no GPU.
flashattn_handle fake_handle(const fa_device_caps &caps) {
    flashattn_handle h;
    std::memset(&h, 0, sizeof h);
    h.caps = caps;
    return h;
}

TEST(StructGrowth, ParamsOfEveryReleasedSizeAreReadNoFurther) {
    const flashattn_handle h = fake_handle(h200_caps());
    const flashattn_fwd_params full = valid_params();
    for (size_t size : {(size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1, (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_3,
                        sizeof(flashattn_fwd_params)}) {
        GuardedBytes mem(size);
        flashattn_fwd_params *p = mem.as<flashattn_fwd_params>();
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_init_size(p, size)) << flashattn_last_error();
        EXPECT_EQ(size, p->struct_size);
        EXPECT_EQ(-1, p->window_left);
        std::memcpy((char *)p + sizeof(size_t), (const char *)&full + sizeof(size_t), size - sizeof(size_t));
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_set_packed_strides(p)) << flashattn_last_error();
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_supported(&h, p)) << size << ": " << flashattn_last_error();
        size_t bytes = 1;
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_workspace_size(&h, p, &bytes));
        flashattn_plan_info info_full, info_sized;
        flashattn_plan_info_init(&info_full);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &full, &info_full));
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, p, (flashattn_plan_info_init(&info_sized), &info_sized)));
        // The older struct plans exactly as the full one with the same values and defaults.
        EXPECT_EQ(0, std::memcmp(&info_full, &info_sized, sizeof info_full)) << info_sized.description;
    }
}

TEST(StructGrowth, FieldsAnOlderCallerDoesNotKnowTakeTheirDefaults) {
    for (size_t size : {(size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1, (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_3}) {
        flashattn_fwd_params defaults, caller, loaded;
        flashattn_fwd_params_init(&defaults);
        std::memset(&caller, 0x5A, sizeof caller);  // garbage past the caller's size must be ignored
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_params_init_size(&caller, size));
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_fwd_params_load(&caller, &loaded));
        EXPECT_EQ(0, std::memcmp(&defaults, &loaded, sizeof loaded)) << size;
    }
}

TEST(StructGrowth, TheExported0_1InitWritesExactly0_1Bytes) {
    GuardedBytes mem(FLASHATTN_FWD_PARAMS_SIZE_0_1);
    fwd_params_0_1 *old = mem.as<fwd_params_0_1>();
    // The parenthesised name calls the symbol a 0.1.0 binary calls, not the header's macro.
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, (flashattn_fwd_params_init)((flashattn_fwd_params *)old));
    EXPECT_EQ((size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1, old->struct_size);
    EXPECT_EQ(-1, old->window_right);
    GuardedBytes info_mem(FLASHATTN_PLAN_INFO_SIZE_0_1);
    flashattn_plan_info *info = info_mem.as<flashattn_plan_info>();
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, (flashattn_plan_info_init)(info));
    EXPECT_EQ((size_t)FLASHATTN_PLAN_INFO_SIZE_0_1, info->struct_size);
    const flashattn_handle h = fake_handle(a100_caps());
    const flashattn_fwd_params p = valid_params();
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &p, info)) << flashattn_last_error();
    EXPECT_EQ((size_t)FLASHATTN_PLAN_INFO_SIZE_0_1, info->struct_size);
    EXPECT_NE(0, info->grid_x);
}

TEST(StructGrowth, UnknownSizesAreRefusedAndNothingIsWritten) {
    const flashattn_handle h = fake_handle(h200_caps());
    for (size_t size : {(size_t)0, (size_t)8, (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1 - 8,
                        (size_t)FLASHATTN_FWD_PARAMS_SIZE_0_1 + 4, sizeof(flashattn_fwd_params) + 8,
                        sizeof(flashattn_fwd_params) * 2}) {
        flashattn_fwd_params p = valid_params();
        p.struct_size = size;
        EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE, flashattn_fwd_supported(&h, &p)) << size;
        EXPECT_NE(std::string(flashattn_last_error()).find("struct_size"), std::string::npos);
        std::vector<unsigned char> buf(2 * sizeof(flashattn_fwd_params), 0xEE);
        EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE,
                  flashattn_fwd_params_init_size((flashattn_fwd_params *)buf.data(), size));
        for (unsigned char b : buf) ASSERT_EQ(0xEE, b);
    }
    flashattn_fwd_params p = valid_params();
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    info.struct_size = sizeof info + 8;
    EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE, flashattn_fwd_plan(&h, &p, &info));
    EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE, flashattn_plan_info_init_size(&info, 64));
}

// ---- flashattn_merge: layout, defaults, validation --------------------------------------------------

TEST(Abi, MergeParamsLayoutIsFrozen) {
    EXPECT_EQ(0u, offsetof(flashattn_merge_params, struct_size));
    EXPECT_EQ(8u, offsetof(flashattn_merge_params, dtype_parts));
    EXPECT_EQ(16u, offsetof(flashattn_merge_params, lse_base));
    EXPECT_EQ(24u, offsetof(flashattn_merge_params, num_parts));
    EXPECT_EQ(64u, offsetof(flashattn_merge_params, o_parts));
    EXPECT_EQ(104u, offsetof(flashattn_merge_params, lse_parts));
    EXPECT_EQ(144u, offsetof(flashattn_merge_params, o));
    EXPECT_EQ(176u, offsetof(flashattn_merge_params, lse));
    EXPECT_EQ(200u, offsetof(flashattn_merge_params, lse_out_seq_stride));
    EXPECT_EQ((size_t)FLASHATTN_MERGE_PARAMS_SIZE_0_2, sizeof(flashattn_merge_params));
}

// Two parts of [2, 5, 3, 64] fp32 O and their LSE, merged into fp16 O and an LSE, all packed.
flashattn_merge_params valid_merge() {
    flashattn_merge_params m;
    flashattn_merge_params_init(&m);
    m.num_parts = 2, m.batch = 2, m.seqlen = 5, m.heads = 3, m.head_dim = 64;
    m.o_parts = (const void *)0x100000;
    m.o_head_stride = 64, m.o_seq_stride = 3 * 64, m.o_batch_stride = 5 * 3 * 64, m.o_part_stride = 2 * 5 * 3 * 64;
    m.lse_parts = (const float *)0x200000;
    m.lse_seq_stride = 1, m.lse_head_stride = 5, m.lse_batch_stride = 15, m.lse_part_stride = 30;
    m.o = (void *)0x300000;
    m.out_head_stride = 64, m.out_seq_stride = 3 * 64, m.out_batch_stride = 5 * 3 * 64;
    m.lse = (float *)0x400000;
    m.lse_out_seq_stride = 1, m.lse_out_head_stride = 5, m.lse_out_batch_stride = 15;
    return m;
}

TEST(Merge, DefaultsAndAValidCall) {
    flashattn_merge_params m;
    std::memset(&m, 0xCD, sizeof m);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_merge_params_init(&m));
    EXPECT_EQ(sizeof m, m.struct_size);
    EXPECT_EQ(FLASHATTN_DTYPE_FLOAT32, m.dtype_parts);
    EXPECT_EQ(FLASHATTN_DTYPE_FLOAT16, m.dtype_out);
    EXPECT_EQ(FLASHATTN_LSE_NATURAL, m.lse_base);
    EXPECT_EQ(nullptr, m.lse);
    flashattn_merge_params v = valid_merge();
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_merge_check(&v)) << flashattn_last_error();
    v.seqlen = 0, v.o_parts = nullptr, v.lse_parts = nullptr, v.o = nullptr;  // nothing to merge: a no-op
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_merge_check(&v)) << flashattn_last_error();
    v = valid_merge();
    v.lse = nullptr;  // the merged LSE is optional
    EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_merge_check(&v)) << flashattn_last_error();
    EXPECT_EQ(FLASHATTN_STATUS_NULL_POINTER, flashattn_merge(nullptr, &v, nullptr));
    EXPECT_EQ(FLASHATTN_STATUS_BAD_STRUCT_SIZE, flashattn_merge_params_init_size(&m, 12));
}

TEST(Merge, EveryBadInputHasItsStatusAndMessage) {
    struct Case {
        const char *what;
        std::function<void(flashattn_merge_params &)> mutate;
        flashattn_status expected;
        const char *mentions;
    };
    const std::vector<Case> cases = {
        {"struct_size", [](auto &m) { m.struct_size = 100; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE, "struct_size"},
        {"reserved0", [](auto &m) { m.reserved0 = 3; }, FLASHATTN_STATUS_BAD_STRUCT_SIZE, "reserved0"},
        {"dtype_parts", [](auto &m) { m.dtype_parts = 3; }, FLASHATTN_STATUS_BAD_DTYPE, "dtype_parts"},
        {"dtype_out", [](auto &m) { m.dtype_out = -1; }, FLASHATTN_STATUS_BAD_DTYPE, "dtype_out"},
        {"lse_base", [](auto &m) { m.lse_base = 2; }, FLASHATTN_STATUS_BAD_LSE_BASE, "lse_base"},
        {"num_parts 0", [](auto &m) { m.num_parts = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "num_parts"},
        {"batch 0", [](auto &m) { m.batch = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "batch"},
        {"seqlen -1", [](auto &m) { m.seqlen = -1; }, FLASHATTN_STATUS_BAD_SHAPE, "seqlen"},
        {"heads > int32", [](auto &m) { m.heads = (int64_t)1 << 31; }, FLASHATTN_STATUS_BAD_SHAPE, "heads"},
        {"head_dim 0", [](auto &m) { m.head_dim = 0; }, FLASHATTN_STATUS_BAD_SHAPE, "head_dim"},
        {"o_parts NULL", [](auto &m) { m.o_parts = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "o_parts"},
        {"lse_parts NULL", [](auto &m) { m.lse_parts = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "lse_parts"},
        {"o NULL", [](auto &m) { m.o = nullptr; }, FLASHATTN_STATUS_NULL_POINTER, "o is NULL"},
        {"o_parts misaligned", [](auto &m) { m.o_parts = (const char *)m.o_parts + 2; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "o_parts"},
        {"o misaligned", [](auto &m) { m.o = (char *)m.o + 1; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "o ="},
        {"lse misaligned", [](auto &m) { m.lse = (float *)0x400002; }, FLASHATTN_STATUS_MISALIGNED_POINTER, "lse ="},
        {"o_part_stride negative", [](auto &m) { m.o_part_stride = -1; }, FLASHATTN_STATUS_BAD_STRIDE, "o_part_stride"},
        {"lse_seq_stride negative", [](auto &m) { m.lse_seq_stride = -4; }, FLASHATTN_STATUS_BAD_STRIDE, "lse_seq_stride"},
        {"out_head_stride negative", [](auto &m) { m.out_head_stride = -64; }, FLASHATTN_STATUS_BAD_STRIDE, "out_head_stride"},
        {"lse_out stride negative", [](auto &m) { m.lse_out_head_stride = -1; }, FLASHATTN_STATUS_BAD_STRIDE, "lse_out_head_stride"},
        {"o_parts overflow", [](auto &m) { m.o_part_stride = INT64_MAX / 2; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "o_parts"},
        {"lse_parts overflow in bytes", [](auto &m) { m.lse_part_stride = INT64_MAX / 4; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "lse_parts"},
        {"element count overflow", [](auto &m) { m.batch = m.seqlen = m.heads = m.head_dim = INT32_MAX; }, FLASHATTN_STATUS_INDEX_OVERFLOW, "head_dim"},
    };
    for (const Case &c : cases) {
        flashattn_merge_params m = valid_merge();
        c.mutate(m);
        const flashattn_status st = fa_merge_check(&m);
        EXPECT_EQ(c.expected, st) << c.what << ": " << flashattn_last_error();
        EXPECT_NE(std::string(flashattn_last_error()).find(c.mentions), std::string::npos)
            << c.what << ": '" << flashattn_last_error() << "' does not mention '" << c.mentions << "'";
    }
}

// ---- refusals that name the limit ---------------------------------------------------------------

TEST(Planning, AutoRefusesWhatNoBackendTakesAndSaysWhichLimits) {
    // (the fused backends' grid limits are reported only where they have a head dim 64 kernel)
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 64) || !fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 64))
        GTEST_SKIP() << "FUSED and FUSED_SM90 head dim 64 not both compiled in this build";
    flashattn_fwd_params p = valid_params();
    p.batch = 70000, p.heads_q = 40000, p.heads_kv = 40000, p.seqlen_q = 1, p.seqlen_k = 1, p.head_dim = 64;
    flashattn_fwd_params_set_packed_strides(&p);
    for (const fa_device_caps &caps : {h200_caps(), a100_caps()}) {
        fa_plan plan;
        EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&caps, &p, 0, &plan));
        const std::string m = flashattn_last_error();
        EXPECT_NE(m.find("heads_q and batch up to 65535"), std::string::npos) << m;
        EXPECT_NE(m.find("batch x heads_q"), std::string::npos) << m;
    }
}

TEST(Planning, AutoRefusesAHeadDimOnlyReferenceTakesWithAStrideCublasCannotTake) {
    flashattn_fwd_params p = valid_params();
    p.head_dim = 36, p.seqlen_q = 3;
    flashattn_fwd_params_set_packed_strides(&p);
    p.q_seq_stride = (int64_t)1 << 31, p.q_batch_stride = (int64_t)1 << 33;
    fa_plan plan;
    const fa_device_caps caps = h200_caps();
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&caps, &p, 0, &plan));
    const std::string m = flashattn_last_error();
    EXPECT_NE(m.find("multiple of 8"), std::string::npos) << m;
    EXPECT_NE(m.find("q_seq_stride"), std::string::npos) << m;
}

TEST(Planning, SharedMemoryRefusalNamesTheHeadDim) {
    flashattn_fwd_params p = valid_params();
    p.head_dim = 256;
    flashattn_fwd_params_set_packed_strides(&p);
    p.backend = FLASHATTN_BACKEND_FUSED;
    fa_device_caps small = a100_caps();
    small.smem_per_block_optin = 48 * 1024;
    fa_plan plan;
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 256)) GTEST_SKIP() << "d256 not compiled in";
    EXPECT_EQ(FLASHATTN_STATUS_UNSUPPORTED, fa_plan_make(&small, &p, 0, &plan));
    EXPECT_NE(std::string(flashattn_last_error()).find("head_dim 256"), std::string::npos) << flashattn_last_error();
}

// Every FUSED tile fits the shared memory of the sm_80-sm_89 GPUs (A100: 163 KB per block; A10, L4,
// L40, RTX 30/40: 99 KB), so AUTO runs FUSED there at every compiled head dim, not REFERENCE.
TEST(Planning, FusedFitsEverySm8xGpuAtEveryHeadDim) {
    const fa_device_caps ada = {0, 8, 9, 142, 101376, 0};
    int planned = 0;
    for (const fa_device_caps &caps : {a100_caps(), ada})
        for (int64_t d : {32, 64, 80, 96, 128, 160, 192, 256}) {
            const int khd = fa_fused_kernel_head_dim(d);
            ASSERT_NE(0, khd);
            EXPECT_LE(fa_fused_smem_bytes(fa_fused_config_for(khd)), 101376) << "kernel head dim " << khd;
            if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, khd)) continue;
            flashattn_fwd_params p = valid_params();
            p.head_dim = d;
            flashattn_fwd_params_set_packed_strides(&p);
            const fa_plan plan = plan_ok(p, caps);
            EXPECT_EQ(FLASHATTN_BACKEND_FUSED, plan.backend) << "head dim " << d << ", sm_" << caps.cc_major << caps.cc_minor;
            EXPECT_EQ(fa_fused_smem_bytes(&plan.cfg), plan.smem_bytes);
            ++planned;
        }
    if (planned == 0) GTEST_SKIP() << "no FUSED head dim compiled in";
}

// The FUSED kernel's shared-memory tiles: unpadded rows at every head dim (plane A: whole 128-byte
// lines, plane B: the last 32 columns of 32, 96 and 160); the planner's byte count is what the
// kernel's layout takes (the launcher refuses a plan that disagrees).
TEST(Planning, FusedSharedMemoryTilesUnpadded) {
    const int64_t want[][3] = {{32, (128 + 2 * 2 * 128) * 32 * 2, 0},
                               {64, (128 + 2 * 2 * 128) * 64 * 2, 64},
                               {96, (128 + 2 * 2 * 64) * 96 * 2, 64},
                               {128, (128 + 2 * 64) * 128 * 2, 128},
                               {160, (64 + 2 * 64) * 160 * 2, 128},
                               {192, (64 + 2 * 64) * 192 * 2, 192},
                               {256, (64 + 2 * 64) * 256 * 2, 256}}; /* 98,304: the largest, the README's figure */
    for (const auto &w : want) {
        const fa_fused_config *cfg = fa_fused_config_for((int)w[0]);
        ASSERT_NE(nullptr, cfg) << "head dim " << w[0];
        EXPECT_EQ(w[2], FA_SMEM_PLANE_A(w[0])) << "head dim " << w[0];
        EXPECT_EQ(w[1], fa_fused_smem_bytes(cfg)) << "head dim " << w[0];
    }
}

TEST(Version, BuildInfoNamesTheCompiledVariants) {
    const std::string info = flashattn_build_info();
    EXPECT_NE(info.find("commit="), std::string::npos) << info;
    EXPECT_NE(info.find("archs="), std::string::npos) << info;
    EXPECT_NE(info.find("fused=d"), std::string::npos) << info;
    EXPECT_NE(info.find("fused_sm90="), std::string::npos) << info;
}

// ---- the handle without a GPU ----------------------------------------------------------------------

TEST(Handle, CreateReportsNoDeviceOrSucceeds) {
    int count = 0;
    const bool has_gpu = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    flashattn_handle *h = (flashattn_handle *)0x1;
    const flashattn_status st = flashattn_handle_create(&h, 0);
    if (has_gpu) {
        EXPECT_TRUE(st == FLASHATTN_STATUS_SUCCESS || st == FLASHATTN_STATUS_DEVICE_TOO_OLD)
            << flashattn_last_error();
        flashattn_handle_destroy(h);
    } else {
        EXPECT_EQ(FLASHATTN_STATUS_NO_DEVICE, st);
        EXPECT_EQ(nullptr, h);
        EXPECT_NE(std::string(flashattn_last_error()).find("device"), std::string::npos);
    }
    h = (flashattn_handle *)0x1;
    EXPECT_EQ(FLASHATTN_STATUS_NO_DEVICE, flashattn_handle_create(&h, 4096));
    EXPECT_EQ(nullptr, h);
}

}  // namespace

TEST(Serving, A0_1CallerCannotSetServingFields) {
    // An application built against 0.1.0 passes 248 bytes: whatever lies after them is never read,
    // so the serving fields keep their defaults and the call is dense.
    GuardedBytes mem(FLASHATTN_FWD_PARAMS_SIZE_0_1);
    flashattn_fwd_params *p = mem.as<flashattn_fwd_params>();
    const flashattn_fwd_params full = valid_params();
    std::memcpy(p, &full, FLASHATTN_FWD_PARAMS_SIZE_0_1);
    p->struct_size = FLASHATTN_FWD_PARAMS_SIZE_0_1;
    const fa_device_caps caps = h200_caps();
    fa_plan plan;
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, p, 0, &plan)) << flashattn_last_error();
    EXPECT_EQ(0, plan.kp.serving);
}

TEST(Planning, Sm90HeadDim128TakesWideKeyTilesForLongUnmaskedCalls) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    flashattn_fwd_params p = valid_params();
    p.seqlen_q = 1024, p.seqlen_k = 8192;
    flashattn_fwd_params_set_packed_strides(&p);
    fa_plan plan = plan_ok(p, h200_caps());
    EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, plan.backend);
    EXPECT_EQ(176, plan.cfg.block_n);  // no mask, 8192 keys: the wide tile
    EXPECT_EQ(128, plan.cfg.block_m);
    EXPECT_EQ(fa_sm90_smem_bytes(128, 128, 176, plan.kp.persistent != 0, 0), plan.smem_bytes);
    EXPECT_LE(plan.smem_bytes, FA_SM90_SMEM_MAX);
    // Head dims 97-128 (multiples of 8) run all of the d128 kernel's k-steps of S: the wide tile too.
    for (int64_t d : {104, 112, 120}) {
        p.head_dim = d;
        flashattn_fwd_params_set_packed_strides(&p);
        EXPECT_EQ(176, plan_ok(p, h200_caps()).cfg.block_n) << d;
    }
    // Head dims 65-96 take the 128-key tile's shorter S (FA_SM90_D128_SHORT_S_HEAD_DIM) at every length.
    EXPECT_EQ(96, FA_SM90_D128_SHORT_S_HEAD_DIM);
    for (int64_t d : {72, 80, 96})
        for (int64_t sk : {4096, 8192, 65536}) {
            p.head_dim = d, p.seqlen_k = sk;
            flashattn_fwd_params_set_packed_strides(&p);
            const fa_plan sp = plan_ok(p, h200_caps());
            EXPECT_EQ(128, sp.cfg.block_n) << d << " " << sk;
            EXPECT_EQ(128, sp.cfg.head_dim) << d << " " << sk;
            EXPECT_EQ(128, sp.cfg.block_m) << d << " " << sk;
        }
    p.head_dim = 128, p.seqlen_k = 4096;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(176, plan_ok(p, h200_caps()).cfg.block_n);  // the rule's first length
    p.seqlen_k = 4095;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(128, plan_ok(p, h200_caps()).cfg.block_n);  // shorter: the default
    p.seqlen_k = 16384, p.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(128, plan_ok(p, h200_caps()).cfg.block_n);  // masked: the default
    p.mask = FLASHATTN_MASK_NONE, p.window_left = 4096;
    EXPECT_EQ(128, plan_ok(p, h200_caps()).cfg.block_n);  // a window counts as a mask
    p.window_left = -1, p.seqlen_q = 64;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(128, plan_ok(p, h200_caps()).cfg.block_n);  // decode-shaped: the default
    p.seqlen_q = 65;
    flashattn_fwd_params_set_packed_strides(&p);
    EXPECT_EQ(176, plan_ok(p, h200_caps()).cfg.block_n);
    // A serving call: the capacity seqlen_k decides.
    flashattn_fwd_params v = valid_varlen_paged();
    v.seqlen_k = 9000, v.pages_per_seq = (9000 + 15) / 16, v.block_table_batch_stride = v.pages_per_seq;
    v.num_pages = 3 * v.pages_per_seq;
    plan = plan_ok(v, h200_caps());
    EXPECT_EQ(176, plan.cfg.block_n);
    EXPECT_EQ(0, plan.kp.persistent);
    // Pages TMA cannot tile (gathered): never the wide tile.
    for (int64_t page : {1, 19}) {
        flashattn_fwd_params g = valid_varlen_paged();
        g.page_size = page, g.k_batch_stride = g.v_batch_stride = page * g.k_seq_stride;
        for (int64_t sk : {4096, 8192, 65536}) {
            g.seqlen_k = sk, g.pages_per_seq = (sk + page - 1) / page, g.block_table_batch_stride = g.pages_per_seq;
            g.num_pages = 3 * g.pages_per_seq;
            const fa_plan gp = plan_ok(g, h200_caps());
            EXPECT_EQ(128, gp.cfg.block_n) << page << " " << sk;
            EXPECT_EQ(1, gp.kp.gather_pages) << page << " " << sk;
        }
    }
    v.seqlen_k = 4096, v.pages_per_seq = 4096 / 16, v.block_table_batch_stride = v.pages_per_seq;
    v.num_pages = 3 * v.pages_per_seq;
    EXPECT_EQ(176, plan_ok(v, h200_caps()).cfg.block_n);  // pages of 16 (TMA): from 4096
    // The plan names the kernel by its key tile.
    const flashattn_handle h = fake_handle(h200_caps());
    flashattn_plan_info info;
    flashattn_plan_info_init(&info);
    ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &v, &info)) << flashattn_last_error();
    EXPECT_NE(std::string(info.kernel_name).find("_n176_"), std::string::npos) << info.kernel_name;
}

TEST(Serving, Sm90PageBoxesAreTheGcdOfPageAndKeyTile) {
    // TMA boxes of gcd(page size, block_n) keys: every multiple of 8 at block_n 80, 96, 112 and 128.
    EXPECT_EQ(16, fa_sm90_page_box(16, 128));
    EXPECT_EQ(128, fa_sm90_page_box(256, 128));
    EXPECT_EQ(8, fa_sm90_page_box(24, 128));
    EXPECT_EQ(16, fa_sm90_page_box(64, 80));
    EXPECT_EQ(80, fa_sm90_page_box(400, 80));
    EXPECT_EQ(1, fa_sm90_page_box(19, 96));
    for (int bn : {80, 96, 112, 128})
        for (int page = 1; page <= 600; ++page)
            EXPECT_EQ(page % 8 == 0, FA_SM90_TMA_PAGES(page, bn) != 0) << page << " " << bn;
    const flashattn_handle h = fake_handle(h200_caps());
    for (int64_t hd : {128, 256}) {
        flashattn_fwd_params p = valid_varlen_paged();
        if (!fa_sm90_compiled(p.dtype, (int)hd)) continue;  // (a build restricted to other head dims)
        p.head_dim = hd, p.page_size = 24, p.pages_per_seq = 9, p.block_table_batch_stride = 9;
        p.q_seq_stride = p.o_seq_stride = hd * p.heads_q, p.q_head_stride = p.o_head_stride = hd;
        p.k_seq_stride = p.v_seq_stride = hd * p.heads_kv, p.k_head_stride = p.v_head_stride = hd;
        p.k_batch_stride = p.v_batch_stride = 24 * p.k_seq_stride;
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &p, &info)) << flashattn_last_error();
        EXPECT_NE(std::string(info.description).find("paged=24:tma"), std::string::npos) << info.description;
    }
}

// FUSED_SM90 reads a TMA page's keys in one box of all their columns (full-width boxes,
// kp.kv_page_groups = G, the pool's 8-row groups from one page to the next) where the kernel's head dim
// is several 64-column regions and the call's own, and K and V's pages are whole 8-row groups apart
// alike; elsewhere one box a 64-column region. The plan says which (paged=16:tma_full / :tma).
TEST(Serving, Sm90FullWidthPageBoxes) {
    const int64_t hkv = 2;
    auto groups = [&](int d, int kd, int page, int64_t pages, int64_t kps, int64_t krs, int64_t vps, int64_t vrs) {
        return fa_sm90_page_groups(d, kd, page, pages, kps, krs, vps, vrs);
    };
    const int64_t nhd = hkv * 128;  // row stride of [pages, page, heads, dim]
    EXPECT_EQ(2, groups(128, 128, 16, 64, 16 * nhd, nhd, 16 * nhd, nhd));                 // [pages, 16, heads, dim]
    EXPECT_EQ(2 * hkv, groups(128, 128, 16, 64, hkv * 16 * 128, 128, hkv * 16 * 128, 128));  // [pages, heads, 16, dim]
    EXPECT_EQ(4, groups(128, 128, 16, 64, 32 * nhd, nhd, 32 * nhd, nhd));                 // K and V halves of one pool
    EXPECT_EQ(3, groups(256, 256, 24, 64, 24 * hkv * 256, hkv * 256, 24 * hkv * 256, hkv * 256));
    EXPECT_EQ(0, groups(96, 128, 16, 64, 16 * hkv * 96, hkv * 96, 16 * hkv * 96, hkv * 96));  // zero columns past 96
    EXPECT_EQ(0, groups(160, 192, 16, 64, 16 * hkv * 160, hkv * 160, 16 * hkv * 160, hkv * 160));
    EXPECT_EQ(0, groups(64, 64, 16, 64, 16 * hkv * 64, hkv * 64, 16 * hkv * 64, hkv * 64));  // one region: nothing to join
    EXPECT_EQ(0, groups(128, 128, 16, 64, 16 * nhd + 8, nhd, 16 * nhd + 8, nhd));         // pages not whole groups apart
    EXPECT_EQ(0, groups(128, 128, 16, 64, 16 * nhd, nhd, 32 * nhd, nhd));                 // K and V laid out differently
    EXPECT_EQ(0, groups(128, 128, 16, 64, 16 * nhd, nhd, 16 * nhd, 2 * nhd));
    EXPECT_EQ(0, groups(128, 128, 16, 64, 8 * nhd, nhd, 8 * nhd, nhd));                   // pages overlapping
    EXPECT_EQ(0, groups(128, 128, 16, (int64_t)INT32_MAX / 2 + 1, 16 * nhd, nhd, 16 * nhd, nhd));  // p G past int32
    EXPECT_EQ(2, groups(128, 128, 16, (int64_t)INT32_MAX / 2, 16 * nhd, nhd, 16 * nhd, nhd));
    // The plan: prefill over pages of 16 at head dim 128 (TMA), at 64 (one region), and gathered pages.
    const fa_device_caps caps = h200_caps();
    const flashattn_handle h = fake_handle(caps);
    auto describe = [&](const flashattn_fwd_params &p, int32_t *g) {
        fa_plan plan;
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, fa_plan_make(&caps, &p, 0, &plan)) << flashattn_last_error();
        *g = plan.kp.kv_page_groups;
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &p, &info)) << flashattn_last_error();
        return std::string(info.description);
    };
    int32_t g = -1;
    if (fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) {
        flashattn_fwd_params p = valid_varlen_paged();  // head dim 128, [64, 16, 2, 128] pools
        std::string d = describe(p, &g);
        EXPECT_EQ(2, g);
        EXPECT_NE(d.find("paged=16:tma_full"), std::string::npos) << d;
        p.k_head_stride = p.v_head_stride = 16 * 128, p.k_seq_stride = p.v_seq_stride = 128;  // head-major pages
        d = describe(p, &g);
        EXPECT_EQ(2 * hkv, g);
        EXPECT_NE(d.find("paged=16:tma_full"), std::string::npos) << d;
        p = valid_varlen_paged();
        p.head_dim = 96;  // the 128 kernel with zero columns: per-region boxes
        p.q_seq_stride = p.o_seq_stride = 96 * p.heads_q, p.q_head_stride = p.o_head_stride = 96;
        p.k_seq_stride = p.v_seq_stride = 96 * hkv, p.k_head_stride = p.v_head_stride = 96;
        p.k_batch_stride = p.v_batch_stride = 16 * p.k_seq_stride;
        d = describe(p, &g);
        EXPECT_EQ(0, g);
        EXPECT_TRUE(d.find("paged=16:tma") != std::string::npos && d.find("tma_full") == std::string::npos) << d;
        p = valid_varlen_paged();
        p.page_size = 19, p.pages_per_seq = 11, p.block_table_batch_stride = 11;  // gathered
        p.k_batch_stride = p.v_batch_stride = 19 * p.k_seq_stride;
        d = describe(p, &g);
        EXPECT_EQ(0, g);
        EXPECT_NE(d.find("paged=19:gather"), std::string::npos) << d;
        p = valid_varlen_paged();
        p.backend = FLASHATTN_BACKEND_FUSED;  // the portable kernel reads rows: no boxes
        describe(p, &g);
        EXPECT_EQ(0, g);
    }
    if (fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 64)) {
        flashattn_fwd_params p = valid_varlen_paged();
        p.head_dim = 64;
        p.q_seq_stride = p.o_seq_stride = 64 * p.heads_q, p.q_head_stride = p.o_head_stride = 64;
        p.k_seq_stride = p.v_seq_stride = 64 * hkv, p.k_head_stride = p.v_head_stride = 64;
        p.k_batch_stride = p.v_batch_stride = 16 * p.k_seq_stride;
        const std::string d = describe(p, &g);
        EXPECT_EQ(0, g);
        EXPECT_TRUE(d.find("paged=16:tma") != std::string::npos && d.find("tma_full") == std::string::npos) << d;
    }
}

// FUSED_SM90 gathers pages in decode (single-consumer tiles: boxes of 8 keys, or every page size when
// the keys are split) and reads them by TMA boxes everywhere else; the page sizes TMA cannot tile are
// always gathered.
TEST(Serving, Sm90GathersPagesInDecode) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "head dim 128 not compiled in this build";
    const flashattn_handle h = fake_handle(h200_caps());
    auto decode = [](int64_t batch, int64_t seqlen_k, int64_t page) {
        flashattn_fwd_params p = valid_params();
        p.batch = batch, p.seqlen_q = 1, p.seqlen_k = seqlen_k, p.heads_q = 32, p.heads_kv = 8;
        flashattn_fwd_params_set_packed_strides(&p);
        p.seqused_k = (const int32_t *)0x710000;
        p.block_table = (const int32_t *)0x720000, p.page_size = page;
        p.pages_per_seq = p.block_table_batch_stride = (seqlen_k + page - 1) / page;
        p.num_pages = batch * p.pages_per_seq;
        p.k_batch_stride = p.v_batch_stride = page * p.k_seq_stride;
        return p;
    };
    struct Case {
        int64_t batch, seqlen_k, page;
        bool split, gathered;
    } cases[] = {
        {1, 8192, 16, true, true},     // 16 splits: boxes of 16 keys gathered
        {1, 8192, 8, true, true},      // boxes of 8
        {1, 8192, 32, true, true},     // boxes of 32 keys: gathered too in a split decode
        {1, 8192, 256, true, true},    // one box a tile: gathered too (docs/performance.md v70)
        {1, 8192, 19, true, true},     // TMA cannot tile 19
        {16, 8192, 16, false, false},  // no split: many key tiles a block, boxes of 16 by TMA
        {16, 8192, 8, false, true},    // boxes of 8 gathered
        {16, 8192, 19, false, true},
    };
    for (const Case &c : cases) {
        flashattn_fwd_params p = decode(c.batch, c.seqlen_k, c.page);
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        ASSERT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &p, &info)) << flashattn_last_error();
        const std::string d = info.description, want = "paged=" + std::to_string(c.page) + (c.gathered ? ":gather" : ":tma");
        EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, info.backend) << d;
        EXPECT_EQ(c.split, info.num_splits > 1) << d;
        EXPECT_NE(d.find(want), std::string::npos) << want << " in " << d;
    }
    // Prefill over pages of 16 (two-consumer tiles) keeps TMA.
    const std::string d = [&] {
        flashattn_fwd_params p = valid_varlen_paged();
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &p, &info)) << flashattn_last_error();
        return std::string(info.description);
    }();
    EXPECT_NE(d.find("paged=16:tma"), std::string::npos) << d;
}

// Head dim 64 serving prefill runs on resident blocks, on the dense call's 192-row (three-consumer)
// tile, except a masked call over at most 2048 keys a sequence, which takes the two-consumer
// (128-row) tile: a ragged batch of short sequences pads less of it. Pages the producer gathers go on
// resident blocks with the 128-row tile and keep a block a tile with the 192-row one; decode shapes
// keep their own rows.
TEST(Serving, Sm90ServingPrefillTiles) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 64)) GTEST_SKIP() << "head dim 64 not compiled in this build";
    const fa_device_caps caps = h200_caps();
    flashattn_fwd_params dense = valid_params();
    dense.batch = 16, dense.seqlen_q = dense.seqlen_k = 1024, dense.heads_q = dense.heads_kv = 16, dense.head_dim = 64;
    flashattn_fwd_params_set_packed_strides(&dense);
    const fa_plan d = plan_ok(dense, caps);
    EXPECT_EQ(192, d.cfg.block_m);
    EXPECT_EQ(1, d.kp.persistent);
    flashattn_fwd_params ragged = dense;  // the same tokens, packed
    ragged.cu_seqlens_q = (const int32_t *)0x700000, ragged.cu_seqlens_k = (const int32_t *)0x708000;
    ragged.total_q = ragged.total_k = 16 * 1024;
    ragged.q_batch_stride = ragged.o_batch_stride = ragged.k_batch_stride = ragged.v_batch_stride = 0;
    auto expect_tile = [&](const flashattn_fwd_params &p, int block_m, int persistent, const char *what) {
        const fa_plan r = plan_ok(p, caps);
        EXPECT_EQ(FLASHATTN_BACKEND_FUSED_SM90, r.backend) << what;
        EXPECT_EQ(block_m, r.cfg.block_m) << what;
        EXPECT_EQ(persistent, r.kp.persistent) << what;
        if (persistent) EXPECT_EQ(fa_sm90_smem_bytes(64, block_m, 128, 1, 1), r.smem_bytes) << what;
    };
    expect_tile(ragged, 192, 1, "no mask, 1024 keys");
    ragged.seqlen_q = ragged.seqlen_k = 8192;
    expect_tile(ragged, 192, 1, "no mask, 8192 keys");
    ragged.mask = FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    ragged.seqlen_q = ragged.seqlen_k = 2048;  // (causal calls of at most 1024 rows take 128 rows anyway)
    expect_tile(ragged, 128, 2, "causal, 2048 keys");
    ragged.seqlen_q = ragged.seqlen_k = 2049;
    expect_tile(ragged, 192, 2, "causal, 2049 keys");
    ragged.seqlen_q = 1536, ragged.seqlen_k = 16384;  // chunked prefill over a long cache
    expect_tile(ragged, 192, 2, "causal, 1536 queries over 16384 keys");
    ragged.mask = FLASHATTN_MASK_NONE, ragged.window_left = 256, ragged.window_right = 0;  // a window is a mask
    ragged.seqlen_q = ragged.seqlen_k = 2048;
    EXPECT_EQ(128, plan_ok(ragged, caps).cfg.block_m);
    ragged.window_left = ragged.window_right = -1;
    // Pages of 16 (TMA boxes) as packed K/V; pages of 1 (gathered): the same tile, on resident blocks
    // with 128 rows (causal), a block a tile with 192 (no mask).
    flashattn_fwd_params paged = ragged;
    paged.seqlen_q = paged.seqlen_k = 1024, paged.cu_seqlens_k = nullptr, paged.total_k = 0;
    paged.seqused_k = (const int32_t *)0x710000;
    for (flashattn_mask mask : {FLASHATTN_MASK_NONE, FLASHATTN_MASK_CAUSAL_BOTTOM_RIGHT})
        for (int64_t page : {16, 1}) {
            paged.mask = mask;
            paged.block_table = (const int32_t *)0x720000, paged.page_size = page;
            paged.pages_per_seq = paged.block_table_batch_stride = 1024 / page;
            paged.num_pages = 16 * paged.pages_per_seq;
            paged.k_batch_stride = paged.v_batch_stride = page * paged.k_seq_stride;
            const fa_plan r = plan_ok(paged, caps);
            EXPECT_EQ(mask == FLASHATTN_MASK_NONE ? 192 : 128, r.cfg.block_m) << "page " << page << " mask " << mask;
            EXPECT_EQ(mask == FLASHATTN_MASK_NONE ? (page == 1 ? 0 : 1) : 2, r.kp.persistent) << "page " << page << " mask " << mask;
        }
    // A decode-shaped serving call keeps its decode tile.
    flashattn_fwd_params decode = dense;
    decode.seqlen_q = 1, decode.heads_q = 32, decode.heads_kv = 8, decode.seqlen_k = 8192;
    flashattn_fwd_params_set_packed_strides(&decode);
    decode.seqused_k = (const int32_t *)0x710000;
    EXPECT_EQ(64, plan_ok(decode, caps).cfg.block_m);
}

TEST(Serving, PlanDescriptionNamesTheServingPaths) {
    if (!fa_sm90_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "no FUSED_SM90 d128 in this build";
    if (!fa_fused_compiled(FLASHATTN_DTYPE_BFLOAT16, 128)) GTEST_SKIP() << "d128 not compiled in";
    const flashattn_handle h = fake_handle(h200_caps());
    auto describe = [&](flashattn_fwd_params p) {
        flashattn_plan_info info;
        flashattn_plan_info_init(&info);
        EXPECT_EQ(FLASHATTN_STATUS_SUCCESS, flashattn_fwd_plan(&h, &p, &info)) << flashattn_last_error();
        return std::string(info.description);
    };
    std::string d = describe(valid_varlen_paged());
    EXPECT_NE(d.find("backend=FUSED_SM90"), std::string::npos) << d;
    EXPECT_NE(d.find("packed_q seqused_k paged=16:tma"), std::string::npos) << d;
    flashattn_fwd_params p = valid_varlen_paged();
    p.page_size = 19, p.pages_per_seq = 11, p.block_table_batch_stride = 11;
    d = describe(p);
    EXPECT_NE(d.find("paged=19:gather"), std::string::npos) << d;
    p.backend = FLASHATTN_BACKEND_FUSED;
    d = describe(p);
    EXPECT_NE(d.find("paged=19:gather"), std::string::npos) << d;
    d = describe(valid_varlen_packed());
    EXPECT_NE(d.find("packed_q packed_kv"), std::string::npos) << d;
    d = describe(valid_indexed_cache());
    EXPECT_NE(d.find("seqused_k kv_batch_idx"), std::string::npos) << d;
    d = describe(valid_append());
    EXPECT_NE(d.find("append+rotary"), std::string::npos) << d;
    EXPECT_LT(d.size(), sizeof(flashattn_plan_info::description)) << d;
}
