#ifndef CSHA256_H
#define CSHA256_H
#include <stddef.h>
#include <stdint.h>

/// Runs the SHA-256 compression function over `blocks` 64-byte blocks at `data`, updating
/// `state` (8 words, H0..H7). Uses the CPU's SHA extensions (SHA-NI) when it has them, else
/// portable C.
void csha256_blocks(uint32_t state[8], const uint8_t *data, size_t blocks);

/// 1 when csha256_blocks uses the SHA extensions on this CPU.
int csha256_accelerated(void);

#endif
