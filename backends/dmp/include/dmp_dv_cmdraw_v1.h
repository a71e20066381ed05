/*
 * DV700 conv command version 1, written by npuc from the documented field list: a u8 -> fp16 input
 * conversion table (at least 6 x 256 bytes) and a BGR swap flag around a version 0 conv command.
 */
#pragma once

#include "dmp_dv_cmdraw_v0.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dmp_dv_cmdraw_conv_v1_impl {
  dmp_dv_cmdraw header;
  dmp_dv_buf u8tofp16_table;
  uint16_t to_bgr;
  uint16_t rsvd[3];
  dmp_dv_cmdraw_conv_v0 conv_cmd;
} dmp_dv_cmdraw_conv_v1;

#ifdef __cplusplus
}
#endif
