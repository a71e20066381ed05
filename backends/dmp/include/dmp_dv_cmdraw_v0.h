/*
 * DV700 raw command structs, version 0, written by npuc from the documented field lists
 * (device header, buffer reference, conv command and its runs). Field order follows the driver's
 * declaration order so that generated sources compile against either header.
 */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dmp_dv_context_impl* dmp_dv_context;
typedef struct dmp_dv_mem_impl* dmp_dv_mem;
typedef struct dmp_dv_cmdlist_impl* dmp_dv_cmdlist;

enum dmp_dv_device_type {
  DMP_DV_DEV_CONV = 1,
  DMP_DV_DEV_FC = 2,
  DMP_DV_DEV_IPU = 3,
  DMP_DV_DEV_MAXIMIZER = 4
};

/* A buffer reference: memory handle and a 16-byte aligned offset into it. */
typedef struct dmp_dv_buf_impl {
  union {
    dmp_dv_mem mem;
    uint64_t rsvd;
  };
  uint64_t offs;
} dmp_dv_buf;

/* Common header of every raw command. */
typedef struct dmp_dv_cmdraw_impl {
  uint32_t size;
  uint8_t device_type;
  uint8_t version;
  uint8_t rsvd[2];
} dmp_dv_cmdraw;

/* One run of a conv command; members sorted by size to avoid padding. */
typedef struct dmp_dv_cmdraw_conv_v0_run_impl {
  dmp_dv_buf weight_buf;
  uint32_t conv_pad;
  uint32_t pool_pad;
  uint16_t m;
  uint16_t conv_enable;
  uint16_t p;
  uint16_t pz;
  uint16_t conv_stride;
  uint16_t conv_dilation;
  uint16_t weight_fmt;
  uint16_t pool_enable;
  uint16_t pool_avg_param;
  uint16_t pool_size;
  uint16_t pool_stride;
  uint16_t actfunc;
  uint16_t actfunc_param;
  uint16_t rectifi_en;
  uint16_t lrn;
  uint16_t rsvd;
} dmp_dv_cmdraw_conv_v0_run;

/* Conv command version 0: up to 32 runs over one input tensor. */
typedef struct dmp_dv_cmdraw_conv_v0_impl {
  dmp_dv_cmdraw header;
  dmp_dv_buf input_buf;
  dmp_dv_buf output_buf;
  dmp_dv_buf eltwise_buf;
  uint32_t topo;
  uint16_t w;
  uint16_t h;
  uint16_t z;
  uint16_t c;
  uint16_t input_circular_offset;
  uint16_t output_mode;
  dmp_dv_cmdraw_conv_v0_run run[32];
} dmp_dv_cmdraw_conv_v0;

/* Fully connected command version 0 (older generated code only). */
typedef struct dmp_dv_cmdraw_fc_v0_impl {
  dmp_dv_cmdraw header;
  dmp_dv_buf weight_buf;
  dmp_dv_buf input_buf;
  dmp_dv_buf output_buf;
  uint16_t input_size;
  uint16_t output_size;
  uint16_t weight_fmt;
  uint16_t actfunc;
  uint16_t actfunc_param;
  uint16_t rsvd[3];
} dmp_dv_cmdraw_fc_v0;

#ifdef __cplusplus
}
#endif
