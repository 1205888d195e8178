/* SPDX-License-Identifier: BSD-3-Clause */
#ifndef MP_CRC32C_H
#define MP_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C (Castagnoli), continuing from @crc (start with 0). SSE4.2 when present. */
uint32_t mp_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
