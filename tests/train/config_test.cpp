#include "kiln/train/config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <tuple>

#include <algorithm>

#include "kiln/cli/config_flags.h"
#include "kiln/core/error.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;


TEST(Config, YamlSetsTypedFields) {
  Config config;
  apply_yaml(config, "num_layers: 6\nlr: 3.0e-4\nbf16: true\nlr_decay_style: linear\n", "run.yaml");
  EXPECT_EQ(config.num_layers, 6);
  EXPECT_DOUBLE_EQ(config.lr, 3e-4);
  EXPECT_TRUE(config.bf16);
  EXPECT_EQ(config.lr_decay_style, "linear");
}

TEST(Config, UnknownKeyNamesFileLineAndKey) {
  Config config;
  const std::string message = error_of([&] { apply_yaml(config, "lr: 1\nnum_layer: 3\n", "run.yaml"); });
  EXPECT_EQ(message, "run.yaml:2: unknown config key 'num_layer'");
}

TEST(Config, WrongTypeNamesKey) {
  Config config;
  EXPECT_EQ(error_of([&] { apply_yaml(config, "hidden_size: wide\n", "run.yaml"); }),
            "run.yaml:1: 'hidden_size' expects an integer, got 'wide'");
  EXPECT_EQ(error_of([&] { apply_yaml(config, "fp16: maybe\n", "run.yaml"); }),
            "run.yaml:1: 'fp16' expects true or false, got 'maybe'");
  EXPECT_NE(error_of([&] { apply_yaml(config, "lr: [1, 2]\n", "run.yaml"); }).find("expects a single value"),
            std::string::npos);
}

TEST(Config, MalformedYamlNamesPosition) {
  Config config;
  const std::string message = error_of([&] { apply_yaml(config, "lr: 1\n  bad: [\n", "run.yaml"); });
  EXPECT_NE(message.find("run.yaml:"), std::string::npos);
  EXPECT_NE(message.find("malformed YAML"), std::string::npos) << message;
}

TEST(Config, FlagsUseMegatronNames) {
  const auto& fields = config_fields();
  const auto find = [&](const std::string& flag) {
    for (const ConfigField& field : fields)
      if (flag_name(field) == flag) return true;
    return false;
  };
  for (const char* flag : {"--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                           "--max-position-embeddings", "--micro-batch-size", "--global-batch-size",
                           "--train-iters", "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters",
                           "--lr-warmup-fraction", "--adam-beta1", "--adam-beta2", "--adam-eps",
                           "--weight-decay", "--clip-grad", "--seed", "--log-interval", "--eval-interval",
                           "--eval-iters", "--save", "--save-interval", "--load", "--data-path", "--fp16",
                           "--bf16", "--init-method-std", "--lr-warmup-iters"})
    EXPECT_TRUE(find(flag)) << flag;
}

// The switches of speed that are on unless turned off, each by a key and a --no- flag.
TEST(Config, SpeedSwitchesAreOnByDefault) {
  for (auto [key, member] : {std::pair{"fused_attention", &Config::fused_attention},
                             std::pair{"matmul_epilogues", &Config::matmul_epilogues},
                             std::pair{"fp8_fast_accumulation", &Config::fp8_fast_accumulation}}) {
    Config config;
    EXPECT_TRUE(config.*member) << key;
    apply_yaml(config, fmt::format("{}: false\n", key), "test.yaml");
    EXPECT_FALSE(config.*member) << key;
    std::string flag_wanted = std::string("--") + key;
    std::replace(flag_wanted.begin(), flag_wanted.end(), '_', '-');
    bool flag = false;
    for (const ConfigField& field : config_fields()) flag |= flag_name(field) == flag_wanted;
    EXPECT_TRUE(flag) << flag_wanted;  // and --no-..., as for every boolean key
    EXPECT_NE(to_yaml(config).find(fmt::format("{}: false", key)), std::string::npos) << key;
  }
}

// Attention kernels that are asked for: wgmma (its mma.sync twins measured faster on the H100) and
// cuDNN's (not yet measured against kiln's) are off by default, and a key and a flag turn each on.
TEST(Config, OtherAttentionKernelsAreAskedFor) {
  for (auto [key, flag_wanted, member] :
       {std::tuple{"warpgroup_attention", "--warpgroup-attention", &Config::warpgroup_attention},
        std::tuple{"cudnn_attention", "--cudnn-attention", &Config::cudnn_attention}}) {
    Config config;
    EXPECT_FALSE(config.*member) << key;
    apply_yaml(config, fmt::format("{}: true\n", key), "test.yaml");
    EXPECT_TRUE(config.*member) << key;
    bool flag = false;
    for (const ConfigField& field : config_fields()) flag |= flag_name(field) == flag_wanted;
    EXPECT_TRUE(flag) << flag_wanted;
    EXPECT_NE(to_yaml(config).find(fmt::format("{}: true", key)), std::string::npos) << key;
  }
}

TEST(Config, GlobalBatchMustDivide) {
  Config config;
  config.micro_batch_size = 4;
  config.global_batch_size = 10;
  config.resolve();
  EXPECT_EQ(error_of([&] { config.validate(); }),
            "config key 'global_batch_size': 10 is not a multiple of micro_batch_size 4 x "
            "data_parallel_size 1");
  config.global_batch_size = 16;
  config.validate();
  EXPECT_EQ(config.accumulation_steps(), 4);
}

TEST(Config, InconsistentValuesAreErrors) {
  auto check = [](auto mutate, const std::string& fragment) {
    Config config;
    mutate(config);
    config.resolve();
    const std::string message = error_of([&] { config.validate(); });
    EXPECT_NE(message.find(fragment), std::string::npos) << "got: " << message;
  };
  check([](Config& c) { c.hidden_size = 100; c.num_attention_heads = 3; }, "'num_attention_heads'");
  check([](Config& c) { c.fp16 = c.bf16 = true; }, "'fp16' and 'bf16'");
  check([](Config& c) { c.seq_length = 256; c.max_position_embeddings = 128; }, "'seq_length'");
  check([](Config& c) { c.num_layers = 0; }, "'num_layers' must be positive");
  check([](Config& c) { c.lr_warmup_iters = 5; c.lr_warmup_fraction = 0.1; }, "both set");
  check([](Config& c) { c.save_interval = 10; }, "'save_interval'");
  check([](Config& c) { c.lr_decay_style = "step"; }, "'step'");
  check([](Config& c) { c.device = "tpu"; }, "'device'");
  check([](Config& c) { c.cuda_graph = true; }, "'cuda_graph' needs --device cuda");
  check([](Config& c) { c.matmul_autotune = true; }, "'matmul_autotune' needs --device cuda");
  check([](Config& c) { c.loss_chunk_rows = 0; }, "config key 'loss_chunk_rows' must be >= 1, got 0");
  check(
      [](Config& c) {
        c.device = "cuda";
        c.cuda_graph = c.profile_ops = true;
      },
      "'cuda_graph' and 'profile_ops'");
  check([](Config& c) { c.hidden_dropout = 1.0; }, "config key 'hidden_dropout' must be in [0, 1), got 1");
  check([](Config& c) { c.hidden_dropout = -0.5; }, "config key 'hidden_dropout' must be in [0, 1), got -0.5");
  check(
      [](Config& c) {
        c.device = "cuda";
        c.hidden_dropout = 0.1;
        c.cuda_graph = true;
      },
      "'hidden_dropout' and 'cuda_graph' are both set");
  // Sizes past any machine, refused before a count overflows or a per-layer list is built.
  check([](Config& c) { c.num_layers = int64_t{1} << 30; }, "are too large: 1073741824 layers (at most 65536)");
  check([](Config& c) { c.micro_batch_size = c.global_batch_size = int64_t{1} << 60; },
        "are too large: the MLP activation");
  check([](Config& c) { c.vocab_size = int64_t{1} << 31; }, "'vocab_size': 2147483648 does not fit the int32 token ids");
  check([](Config& c) { c.global_batch_size = 16; c.data_parallel_size = int64_t{1} << 62; }, "not a multiple");
  // Real numbers must be finite and fit fp32, as the optimizer and the loss scaler keep them.
  check([](Config& c) { c.lr = 1e300; }, "config key 'lr' must be a finite number within fp32's range, got 1e+300");
  check([](Config& c) { c.initial_loss_scale = INFINITY; }, "config key 'initial_loss_scale' must be a finite number");
  check([](Config& c) { c.adam_eps = NAN; }, "config key 'adam_eps' must be a finite number");
}

TEST(Config, YamlRoundTrips) {
  Config config;
  config.lr = 1.2345e-4;
  config.data_path = "/data/x";
  config.fp16 = true;
  config.resolve();
  Config again;
  apply_yaml(again, to_yaml(config), "printed");
  EXPECT_EQ(to_yaml(again), to_yaml(config));
  EXPECT_DOUBLE_EQ(again.lr, 1.2345e-4);
}

TEST(Config, DerivedDefaultsAndWarmup) {
  Config config;
  config.train_iters = 200;
  config.lr_warmup_fraction = 0.1;
  config.resolve();
  EXPECT_EQ(config.lr_decay_iters, 200);
  EXPECT_EQ(config.max_position_embeddings, config.seq_length);
  EXPECT_EQ(config.global_batch_size, config.micro_batch_size);
  EXPECT_EQ(config.lr_schedule().warmup_iters, 20);
}


// A Config from `kiln train`'s flags, parsed as main() parses them (a root app and its subcommand).
Config from_flags(const std::string& arguments) {
  CLI::App root;
  CLI::App* train = root.add_subcommand("train");
  auto flags = std::make_shared<cli::ConfigFlags>();
  cli::add_config_flags(*train, flags);
  root.parse("train " + arguments);
  return flags->build();
}

// A toy BPE vocabulary in GPT-2's file formats (encoder.json, vocab.bpe): 6 tokens, 2 merges.
void write_toy_bpe(const std::string& dir) {
  std::ofstream(dir + "/encoder.json") << R"({"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "\u0120": 5})";
  std::ofstream(dir + "/vocab.bpe") << "#version: 0.2\na b\nab c\n";
}

// Megatron-LM's defaults (megatron/arguments.py): adam, no tensor or pipeline parallelism, the local
// DDP, timing level 0, every fusion on.
TEST(Config, MegatronKeysHaveMegatronDefaults) {
  Config config;
  EXPECT_EQ(config.optimizer, "adam");
  EXPECT_EQ(config.tensor_model_parallel_size, 1);
  EXPECT_EQ(config.pipeline_model_parallel_size, 1);
  EXPECT_EQ(config.ddp_impl, "local");
  EXPECT_EQ(config.timing_log_level, 0);
  EXPECT_EQ(config.data_impl, "mmap");
  EXPECT_TRUE(config.masked_softmax_fusion && config.bias_gelu_fusion && config.bias_dropout_fusion &&
              config.gradient_accumulation_fusion);
  EXPECT_EQ(config.vocab_file, "");
  EXPECT_EQ(config.tokenizer_vocab_size(), 0);
  config.resolve();
  config.validate();
}

TEST(Config, MegatronKeysParseFromYamlAndFlags) {
  TempDir dir;
  write_toy_bpe(dir.path());
  const std::string vocab = dir / "encoder.json", merges = dir / "vocab.bpe";
  Config yaml;
  apply_yaml(yaml,
             "vocab_file: " + vocab + "\nmerge_file: " + merges +
                 "\noptimizer: adam\ndata_impl: infer\ntensor_model_parallel_size: 1\n"
                 "pipeline_model_parallel_size: 1\nddp_impl: torch\ntiming_log_level: 2\n"
                 "masked_softmax_fusion: false\nbias_gelu_fusion: false\nbias_dropout_fusion: false\n"
                 "gradient_accumulation_fusion: false\n",
             "run.yaml");
  const Config flags = from_flags(
      "--vocab-file " + vocab + " --merge-file " + merges +
      " --optimizer adam --data-impl infer --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
      "--DDP-impl torch --timing-log-level 2 --no-masked-softmax-fusion --no-bias-gelu-fusion "
      "--no-bias-dropout-fusion --no-gradient-accumulation-fusion");
  for (const Config* config : std::vector<const Config*>{&yaml, &flags}) {
    EXPECT_EQ(config->vocab_file, vocab);
    EXPECT_EQ(config->merge_file, merges);
    EXPECT_EQ(config->optimizer, "adam");
    EXPECT_EQ(config->data_impl, "infer");
    EXPECT_EQ(config->ddp_impl, "torch");
    EXPECT_EQ(config->timing_log_level, 2);
    EXPECT_FALSE(config->masked_softmax_fusion);
    EXPECT_FALSE(config->bias_gelu_fusion);
    EXPECT_FALSE(config->bias_dropout_fusion);
    EXPECT_FALSE(config->gradient_accumulation_fusion);
    EXPECT_EQ(config->tokenizer_vocab_size(), 6);
    Config resolved = *config;
    resolved.resolve();
    resolved.validate();
    for (const char* line : {"ddp_impl: torch\n", "timing_log_level: 2\n", "bias_dropout_fusion: false\n"})
      EXPECT_NE(to_yaml(resolved).find(line), std::string::npos) << line << " is recorded (--print-config, checkpoints)";
  }
  EXPECT_EQ(to_yaml(yaml), to_yaml(flags));
  // Both spellings of Megatron's --DDP-impl, and the fusions turned back on.
  EXPECT_EQ(from_flags("--ddp-impl torch").ddp_impl, "torch");
  EXPECT_TRUE(from_flags("--no-bias-gelu-fusion --bias-gelu-fusion").bias_gelu_fusion);
}

// Megatron's argparse keeps the last of repeated flags, and scripts append overrides to a base
// command line; the flags were applied in the order CLI11 registered them, and a repeated value
// was refused.
TEST(Config, LastOfRepeatedFlagsWins) {
  EXPECT_TRUE(from_flags("--no-fp16 --fp16").fp16);
  EXPECT_FALSE(from_flags("--fp16 --no-fp16").fp16);
  EXPECT_DOUBLE_EQ(from_flags("--lr 1e-3 --lr 2e-4").lr, 2e-4);
  EXPECT_EQ(from_flags("--DDP-impl torch --ddp-impl local").ddp_impl, "local");
}

TEST(Config, UnsupportedMegatronValuesNameTheKey) {
  TempDir dir;
  write_toy_bpe(dir.path());
  const auto error = [](auto mutate) {
    Config config;
    mutate(config);
    config.resolve();
    return error_of([&] { config.validate(); });
  };
  EXPECT_EQ(error([](Config& c) { c.optimizer = "sgd"; }),
            "config key 'optimizer' is sgd: not supported (kiln trains with adam, Adam with decoupled weight decay, "
            "Megatron's default)");
  EXPECT_EQ(error([](Config& c) { c.optimizer = "lamb"; }),
            "config key 'optimizer': 'lamb' is not adam (Megatron's other choice, sgd, is not supported)");
  EXPECT_EQ(error([](Config& c) { c.tensor_model_parallel_size = 2; }),
            "config key 'tensor_model_parallel_size' is 2: tensor parallelism is not supported yet (kiln is "
            "data-parallel only)");
  EXPECT_EQ(error([](Config& c) { c.pipeline_model_parallel_size = 4; }),
            "config key 'pipeline_model_parallel_size' is 4: pipeline parallelism is not supported yet (kiln is "
            "data-parallel only)");
  EXPECT_EQ(error([](Config& c) { c.tensor_model_parallel_size = 0; }),
            "config key 'tensor_model_parallel_size' must be positive, got 0");
  EXPECT_EQ(error([](Config& c) { c.data_impl = "lazy"; }),
            "config key 'data_impl' is lazy: Megatron's lazy indexed datasets are not supported; kiln reads the mmap "
            "format (MMIDIDX), which Megatron's tools/preprocess_data.py writes by default (--dataset-impl mmap)");
  EXPECT_NE(error([](Config& c) { c.data_impl = "cached"; }).find("'data_impl' is cached"), std::string::npos);
  EXPECT_EQ(error([](Config& c) { c.data_impl = "zip"; }), "config key 'data_impl': 'zip' is not mmap or infer");
  EXPECT_NE(error([](Config& c) { c.ddp_impl = "fsdp"; }).find("config key 'ddp_impl': 'fsdp' is not local or torch"),
            std::string::npos);
  EXPECT_EQ(error([](Config& c) { c.timing_log_level = 3; }),
            "config key 'timing_log_level' must be 0, 1 or 2, got 3");
  // The tokenizer's files: both or neither, present, one vocabulary, ids the model can embed.
  const std::string vocab = dir / "encoder.json", merges = dir / "vocab.bpe";
  EXPECT_EQ(error([&](Config& c) {
              c.vocab_file = dir / "gpt2-vocab.json";
              c.merge_file = merges;
            }),
            "config key 'vocab_file': '" + (dir / "gpt2-vocab.json") + "' does not exist");
  EXPECT_EQ(error([&](Config& c) {
              c.vocab_file = vocab;
              c.merge_file = dir.path();
            }),
            "config key 'merge_file': '" + dir.path() + "' is not a file");
  EXPECT_EQ(error([&](Config& c) { c.vocab_file = vocab; }),
            "config keys 'vocab_file' and 'merge_file' go together (GPT-2's BPE needs both), but only 'vocab_file' "
            "is set");
  EXPECT_EQ(error([&](Config& c) {
              c.vocab_file = vocab;
              c.merge_file = merges;
              c.vocab_size = 5;
            }),
            "config key 'vocab_file': " + vocab + " has ids up to 5, beyond vocab_size 5 (the model could not embed "
            "them)");
  // Swapped files, and merges of another vocabulary, are named with the line.
  EXPECT_NE(error([&](Config& c) {
              c.vocab_file = merges;
              c.merge_file = vocab;
            }).find("config key 'vocab_file': " + merges + ": not valid JSON"),
            std::string::npos);
  std::ofstream(dir / "other.bpe") << "#version: 0.2\na b\nb c\n";
  EXPECT_EQ(error([&](Config& c) {
              c.vocab_file = vocab;
              c.merge_file = dir / "other.bpe";
            }),
            "config key 'merge_file': " + (dir / "other.bpe") + ":3: merge 'b c' uses tokens that vocab_file " + vocab +
                " does not have (the two files are not one vocabulary)");
  // What Megatron's default (infer) and the course's values mean to kiln: accepted.
  EXPECT_EQ(error([&](Config& c) {
              c.data_impl = "infer";
              c.ddp_impl = "torch";
              c.vocab_file = vocab;
              c.merge_file = merges;
              c.vocab_size = 6;
            }),
            "");
  // One replica joins no group: Megatron's default backend, nccl, is no error on the CPU.
  EXPECT_EQ(error([](Config& c) { c.distributed_backend = "nccl"; }), "");
  EXPECT_NE(error([](Config& c) {
              c.distributed_backend = "nccl";
              c.data_parallel_size = 2;
              c.global_batch_size = 2 * c.micro_batch_size;
            }).find("is nccl with --device cpu"),
            std::string::npos);
}

TEST(Config, UnknownFlagsAreNamedOneLineEachWithTheClosest) {
  const std::vector<std::string> known = {"--hidden-size", "--lr", "--lr-decay-style", "--num-layers", "--DDP-impl",
                                          "--help"};
  EXPECT_EQ(cli::unknown_flags_message({"--hiden-size", "3", "--lrr", "1"}, known, "kiln train"),
            "kiln: error: unknown flag '--hiden-size' (did you mean --hidden-size?)\n"
            "kiln: error: unknown flag '--lrr' (did you mean --lr?)\n"
            "kiln: the flags `kiln train --help` lists are the ones it knows");
  // Values with '=' or negative, flags without a value, nothing close, a stray word, case.
  EXPECT_EQ(cli::unknown_flags_message({"stray", "--num-layer=3", "--tensorboard-dir", "TB",
                                        "--log-timers-to-tensorboard", "--lr-decay-styl", "-1e-3", "--ddp-impl",
                                        "local", "-x"},
                                       known, "kiln bench train"),
            "kiln: error: unexpected argument 'stray' (kiln bench train takes flags only)\n"
            "kiln: error: unknown flag '--num-layer' (did you mean --num-layers?)\n"
            "kiln: error: unknown flag '--tensorboard-dir'\n"
            "kiln: error: unknown flag '--log-timers-to-tensorboard'\n"
            "kiln: error: unknown flag '--lr-decay-styl' (did you mean --lr-decay-style?)\n"
            "kiln: error: unknown flag '--ddp-impl' (did you mean --DDP-impl?)\n"
            "kiln: error: unknown flag '-x'\n"
            "kiln: the flags `kiln bench train --help` lists are the ones it knows");
  EXPECT_EQ(cli::unknown_flags_message({}, known, "kiln train"), "");
}

TEST(Config, UnknownFlagsStopTheParseBeforeTheCommandRuns) {
  CLI::App root;
  CLI::App* train = root.add_subcommand("train");
  auto flags = std::make_shared<cli::ConfigFlags>();
  cli::add_config_flags(*train, flags);
  bool ran = false;
  train->callback([&] { ran = true; });
  try {
    root.parse(std::string("train --num-layers 2 --hiden-size 3 --lrr 1"));
    ADD_FAILURE() << "parsed";
  } catch (const CLI::ExtrasError& error) {
    EXPECT_EQ(std::string(error.what()),
              "kiln: error: unknown flag '--hiden-size' (did you mean --hidden-size?)\n"
              "kiln: error: unknown flag '--lrr' (did you mean --lr?)\n"
              "kiln: the flags `kiln train --help` lists are the ones it knows");
    EXPECT_EQ(error.get_exit_code(), static_cast<int>(CLI::ExitCodes::ExtrasError));
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// examples/seed-lab.yaml is the lab's model: the encoder classifier at 18 x 1280, 390 M parameters
// (tests/perf/encoder_estimate_test.cpp works the count out).
TEST(Config, TheSeedLabExampleIsTheLabsClassifier) {
  const std::filesystem::path repository = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  Config config;
  apply_yaml_file(config, (repository / "examples/seed-lab.yaml").string());
  config.resolve();
  config.validate();
  EXPECT_EQ(config.model, "encoder-classifier");
  EXPECT_EQ(config.hidden_dropout, 0.1);
  EXPECT_EQ(config.micro_batch_size, 5);
  const int64_t parameters = config.architecture()->num_parameters();
  EXPECT_GT(parameters, 380'000'000);
  EXPECT_LT(parameters, 400'000'000);
  EXPECT_EQ(parameters, 399'836'162);
}

// hidden_dropout and attention_dropout left to the model: GPT keeps everything (today's runs keep their numbers), the
// encoder classifier drops 0.1 (Megatron's default and the lab's).
TEST(Config, HiddenDropoutDefaultsByModel) {
  Config gpt;
  gpt.resolve();
  EXPECT_EQ(gpt.hidden_dropout, 0.0);
  EXPECT_EQ(gpt.attention_dropout, 0.0);
  Config encoder;
  encoder.model = "encoder-classifier";
  encoder.resolve();
  EXPECT_EQ(encoder.hidden_dropout, 0.1);
  EXPECT_EQ(encoder.attention_dropout, 0.1);
  encoder.hidden_dropout = 0.0;  // a rate given stays
  encoder.resolve();
  EXPECT_EQ(encoder.hidden_dropout, 0.0);
  Config unknown;
  unknown.model = "bert";
  EXPECT_NE(testing::error_of([&] { unknown.resolve(); }).find("'bert' is not a model kiln builds"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
