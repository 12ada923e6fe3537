// SHA-256 compression (FIPS 180-4): the SHA-NI path on x86-64 CPUs that have it, portable C
// otherwise. The Swift `SHA256` type in HeraldCore keeps buffering, padding and the API.
#include "csha256.h"
#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void blocks_portable(uint32_t state[8], const uint8_t *p, size_t blocks) {
    uint32_t w[64];
    while (blocks--) {
        for (int t = 0; t < 16; t++) {
            w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
        }
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = ROTR(w[t - 15], 7) ^ ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = ROTR(w[t - 2], 17) ^ ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
            uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        state[0] += a; state[1] += b; state[2] += c; state[3] += d;
        state[4] += e; state[5] += f; state[6] += g; state[7] += h;
        p += 64;
    }
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

// The SHA-NI instructions keep the state as two vectors, (A,B,E,F) and (C,D,G,H), each with the
// first-named word in the highest lane. sha256rnds2 runs two rounds with the two message+constant
// words in the low lanes of its third operand; sha256msg1/msg2 compute the message schedule four
// words at a time.
__attribute__((target("sha,sse4.1,ssse3")))
static void blocks_shani(uint32_t state[8], const uint8_t *p, size_t blocks) {
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i abcd = _mm_loadu_si128((const __m128i *)&state[0]);   // lanes a b c d
    __m128i efgh = _mm_loadu_si128((const __m128i *)&state[4]);   // lanes e f g h
    __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);                  // lanes b a d c
    __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);                  // lanes h g f e
    __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);                 // lanes f e b a
    __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);              // lanes h g d c
    while (blocks--) {
        const __m128i saveABEF = abef, saveCDGH = cdgh;
        __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 0)), byteswap);
        __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), byteswap);
        __m128i w2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), byteswap);
        __m128i w3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), byteswap);
        for (int i = 0; i < 16; i++) {
            __m128i x = _mm_add_epi32(w0, _mm_loadu_si128((const __m128i *)&K[4 * i]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, x);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(x, 0x0E));
            // The next four words of the schedule: w[t-16] + s0(w[t-15]) + w[t-7] + s1(w[t-2]).
            __m128i next = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(w0, w1), _mm_alignr_epi8(w3, w2, 4)), w3);
            w0 = w1; w1 = w2; w2 = w3; w3 = next;
        }
        abef = _mm_add_epi32(abef, saveABEF);
        cdgh = _mm_add_epi32(cdgh, saveCDGH);
        p += 64;
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);                  // lanes a b e f
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);                  // lanes g h c d
    abcd = _mm_blend_epi16(feba, dchg, 0xF0);                      // lanes a b c d
    efgh = _mm_alignr_epi8(dchg, feba, 8);                         // lanes e f g h
    _mm_storeu_si128((__m128i *)&state[0], abcd);
    _mm_storeu_si128((__m128i *)&state[4], efgh);
}

static int detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 19)) || !(c & (1u << 9))) return 0;     // SSE4.1, SSSE3
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1;                                        // SHA
}
#else
static int detect(void) { return 0; }
#endif

// -1: not yet known. A race writes the same answer twice.
static volatile int accelerated = -1;

int csha256_accelerated(void) {
    if (accelerated < 0) accelerated = detect();
    return accelerated;
}

void csha256_blocks(uint32_t state[8], const uint8_t *data, size_t blocks) {
#if defined(__x86_64__)
    if (csha256_accelerated()) { blocks_shani(state, data, blocks); return; }
#endif
    blocks_portable(state, data, blocks);
}
