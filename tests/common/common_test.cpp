#include <gtest/gtest.h>

#include "dsv4/common.h"

TEST(Common, HumanBytes) {
    EXPECT_EQ(dsv4::human_bytes(512), "512 B");
    EXPECT_EQ(dsv4::human_bytes(1536), "1.50 KiB");
    EXPECT_EQ(dsv4::human_bytes(3ull << 30), "3.00 GiB");
}

TEST(Common, ErrorMessage) {
    try {
        dsv4::fail("tensor ", "blk.0.attn_q_a.weight", ": expected ", 4, ", found ", 5);
        FAIL();
    } catch (const dsv4::Error& e) {
        EXPECT_STREQ(e.what(), "tensor blk.0.attn_q_a.weight: expected 4, found 5");
    }
}
