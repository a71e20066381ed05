/*
 * Base class of generated DV700 networks, declared by npuc from the documented members of the
 * application's CDMP_Network: the fpga_layer table, the two device memories (weights and io) and the
 * helpers a generated Initialize() calls. Only declarations: link against the DV700 application library.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "dmp_dv_cmdraw_v0.h"
#include "dmp_dv_cmdraw_v1.h"

enum layer_type {
  LT_INPUT,
  LT_CONV,
  LT_FC,
  LT_FLATTEN,
  LT_CONCAT,
  LT_COPY_CONCAT,
  LT_SOFTMAX,
  LT_CUSTOM
};

struct fpga_layer;

/* A CPU layer callback: the layer, its parameter struct and the io memory. */
typedef void (*run_custom_callback_proc)(fpga_layer& layer, void* custom_param, uint8_t* io_ptr);

struct fpga_layer {
  layer_type type;
  std::string name;
  union {
    dmp_dv_cmdraw_conv_v0 conv_conf;
    dmp_dv_cmdraw_conv_v1 conv_conf_v1;
    dmp_dv_cmdraw_fc_v0 fc_conf;
    int softmax_axis;
    struct {
      int input_layer_num;
      fpga_layer** input_layers;
    };
    struct {
      run_custom_callback_proc custom_proc_ptr;
      void* custom_param;
    };
  };
  size_t input_offs;
  size_t output_offs;
  size_t output_size;
  int input_dim[3];
  int input_dim_size;
  int output_dim[3];
  int output_dim_size;
  bool is_output;
  bool is_f32_output;
  bool is_input_hw_layout;
  dmp_dv_cmdlist cmdlist;
  int cmdlist_pos;
  int cmdlist_size;
};

class CDMP_Network {
 public:
  CDMP_Network();
  virtual ~CDMP_Network();

  virtual bool Initialize() = 0;
  bool LoadWeights(const std::string& filename);
  bool GenerateCommandLists();
  bool RunNetwork();

  void* get_network_input_addr_cpu();
  void get_final_output(std::vector<float>& out, int index = 0);
  fpga_layer& get_layer(int index) { return layers_[index]; }

 protected:
  bool ReserveMemory(size_t weights_size, size_t io_size);
  void set_num_layers(int n);
  void set_num_output_layers(int n);

  std::vector<fpga_layer> layers_;
  std::vector<fpga_layer*> output_layers_;
  dmp_dv_context ctx_;
  dmp_dv_mem weights_mem_;
  dmp_dv_mem io_mem_;
  uint8_t* io_ptr_;
  bool is_weight_transposed;
};
