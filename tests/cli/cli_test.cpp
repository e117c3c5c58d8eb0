// The `kiln` command as a user runs it: exit codes and one-line errors that name the culprit.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::TempDir;

using Result = testing::CommandResult;
using testing::kiln_binary;
using testing::run_kiln;

std::string tiny_model_flags() {
  return "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "
         "--eval-iters 1 --log-interval 1";
}

TEST(Cli, VersionAndHelp) {
  const Result version = run_kiln("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("kiln 0.1.0"), std::string::npos) << version.output;
  const Result help = run_kiln("train --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--global-batch-size"), std::string::npos);
  EXPECT_EQ(run_kiln("generate --help").exit_code, 0);
  EXPECT_EQ(run_kiln("data prepare-text --help").exit_code, 0);
}

TEST(Cli, PrepareTrainGenerateEndToEnd) {
  TempDir dir;
  std::ofstream(dir / "speech.txt") << std::string(4000, 'a') + "The quick brown fox jumps over the lazy dog. ";
  std::ofstream(dir / "other.txt") << std::string(3000, 'b');
  const Result prepared = run_kiln("data prepare-text " + (dir / "speech.txt") + " " + (dir / "other.txt") +
                                   " --output " + (dir / "data") + " --val-fraction 0.3");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const Result trained = run_kiln("train --data-path " + (dir / "data") + " " + tiny_model_flags() +
                                  " --train-iters 3 --save " + (dir / "ckpt"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find(" iteration        3/       3 | consumed samples:            6 |"),
            std::string::npos)
      << trained.output;
  for (const char* field : {"elapsed time per iteration (ms):", "throughput per GPU (TFLOP/s/GPU):",
                            "tokens per second:", "learning rate:", "global batch size:", "lm loss:",
                            "loss scale:", "grad norm:", "number of skipped iterations:",
                            "number of nan iterations:", "validation loss at", "lm loss PPL:"})
    EXPECT_NE(trained.output.find(field), std::string::npos) << field;
  const Result generated = run_kiln("generate --load " + (dir / "ckpt") + " --prompt Hello --max-new-tokens 8");
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_EQ(generated.output.rfind("Hello", 0), 0u) << generated.output;
  // Sampling settings that mean nothing are refused by flag, before the checkpoint is read.
  const std::string load = "generate --load " + (dir / "ckpt");
  for (const auto& [flags, fragment] :
       {std::pair{" --top-k -3", "--top-k must be >= 0"}, {" --temperature -1", "--temperature must be a finite"},
        {" --temperature nan", "--temperature must be a finite"}, {" --temperature inf", "--temperature must be"},
        {" --max-new-tokens 0", "--max-new-tokens must be positive"}, {" --prompt ''", "--prompt must not be empty"}}) {
    const Result refused = run_kiln(load + flags);
    EXPECT_NE(refused.exit_code, 0) << flags;
    EXPECT_NE(refused.output.find(fragment), std::string::npos) << flags << ": " << refused.output;
  }
  // A prompt longer than the model's window is continued from its last window of bytes.
  const Result long_prompt = run_kiln(load + " --prompt " + std::string(200, 'a') + " --max-new-tokens 4");
  ASSERT_EQ(long_prompt.exit_code, 0) << long_prompt.output;
  EXPECT_EQ(long_prompt.output.rfind(std::string(200, 'a'), 0), 0u) << long_prompt.output;
}

TEST(Cli, PrintConfigShowsResolvedYaml) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 1000, 200);
  std::ofstream(dir / "run.yaml") << "num_layers: 3\nmicro_batch_size: 2\n";
  const Result result = run_kiln("train --config " + (dir / "run.yaml") + " --data-path " + dir.path() +
                                 " --global-batch-size 8 --print-config");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("num_layers: 3"), std::string::npos);
  EXPECT_NE(result.output.find("global_batch_size: 8"), std::string::npos);
  EXPECT_NE(result.output.find("vocab_size: 29"), std::string::npos);  // resolved from meta.json
}

TEST(Cli, TokenizeAndDecodeGpt2) {
  TempDir dir;
  std::ofstream(dir / "text") << " The quick brown fox";
  std::ofstream(dir / "ids") << "15496 995\n";
  std::ofstream(dir / "bad") << "15496 oops";
  const Result ids = run_kiln("data tokenize < " + (dir / "text"));
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  EXPECT_EQ(ids.output, "383 2068 7586 21831\n");
  const Result text = run_kiln("data tokenize --decode < " + (dir / "ids"));
  EXPECT_EQ(text.output, "Hello world");
  const Result bad = run_kiln("data tokenize --decode < " + (dir / "bad"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("'oops' (item 1) is not a token id"), std::string::npos) << bad.output;
}

TEST(Cli, BenchCommandsOnTheCpu) {
  const Result gemm = run_kiln("bench gemm --device cpu --m 64 --n 48 --k 32 --iters 3 --json");
  ASSERT_EQ(gemm.exit_code, 0) << gemm.output;
  const auto gemm_json = nlohmann::json::parse(gemm.output);
  EXPECT_EQ(gemm_json["dtype"], "fp32");
  EXPECT_GT(gemm_json["tflops"].get<double>(), 0.0);
  const Result autotune = run_kiln("bench gemm --device cpu --matmul-autotune --iters 1");
  EXPECT_EQ(autotune.exit_code, 1);
  EXPECT_NE(autotune.output.find("--matmul-autotune needs --device cuda"), std::string::npos) << autotune.output;

  const Result train = run_kiln("bench train --device cpu --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
                                "--seq-length 8 --micro-batch-size 2 --vocab-size 64 --warmup-iters 1 --timed-iters 2 "
                                "--json");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto train_json = nlohmann::json::parse(train.output);
  EXPECT_EQ(train_json["parameters"].get<int64_t>(), 64 * 16 + 8 * 16 + 12 * 16 * 16 + 13 * 16 + 2 * 16);
  EXPECT_NEAR(train_json["tokens_per_second"].get<double>(),
              16.0 / (train_json["median_ms_per_iteration"].get<double>() * 1e-3), 1e-6);
  EXPECT_EQ(train_json["precision"], "fp32");
  EXPECT_EQ(train_json["roofline_ms_per_iteration"].get<double>(), 0.0);  // no datasheet for a CPU
  ASSERT_EQ(train_json["losses"].size(), 3u);  // warm-up and timed iterations
  EXPECT_NEAR(train_json["losses"][0].get<double>(), std::log(64.0), 0.3);
  EXPECT_TRUE(train_json["loss_plausible"].get<bool>());
  EXPECT_EQ(train_json["loss_chunk_rows"].get<int64_t>(), 4096);
  // The classifier and loss 3 positions at a time (chunks of 3, 3, 3, 3, 3 and 1): the same losses
  // but for the order the chunks add wte's gradient in.
  const Result chunked = run_kiln("bench train --device cpu --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
                                  "--seq-length 8 --micro-batch-size 2 --vocab-size 64 --warmup-iters 1 --timed-iters 2 "
                                  "--loss-chunk-rows 3 --profile-ops --json");
  ASSERT_EQ(chunked.exit_code, 0) << chunked.output;
  const auto chunked_json = nlohmann::json::parse(chunked.output);
  EXPECT_EQ(chunked_json["loss_chunk_rows"].get<int64_t>(), 3);
  std::map<std::string, int64_t> classifier_calls;  // the tied classifier's products, [rows x 16] x [16 x 64]
  for (const auto& op : chunked_json["op_times"]) {
    const std::string name = op["op"].get<std::string>();
    if (name.find("x16x64") != std::string::npos && name.find(" +") == std::string::npos)
      classifier_calls[name] = op["calls"].get<int64_t>();
  }
  // The 16 positions of each of the 2 profiled (timed) iterations: five chunks of 3 and one of 1.
  EXPECT_EQ(classifier_calls, (std::map<std::string, int64_t>{{"matmul_backward 1x16x64", 2},
                                                              {"matmul_backward 3x16x64", 10},
                                                              {"matmul_forward 1x16x64", 2},
                                                              {"matmul_forward 3x16x64", 10}}));
  ASSERT_EQ(chunked_json["losses"].size(), 3u);
  EXPECT_EQ(chunked_json["losses"][0].get<double>(), train_json["losses"][0].get<double>());
  for (size_t i = 1; i < 3; ++i)
    EXPECT_NEAR(chunked_json["losses"][i].get<double>(), train_json["losses"][i].get<double>(), 1e-5);
  // A step that computes nonsense fast: its row is printed, then named as wrong, exit 1.
  const Result diverging = run_kiln("bench train --device cpu --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
                                    "--seq-length 8 --micro-batch-size 2 --vocab-size 64 --warmup-iters 1 "
                                    "--timed-iters 2 --lr 10 --json");
  EXPECT_EQ(diverging.exit_code, 1) << diverging.output;
  EXPECT_NE(diverging.output.find("\"loss_plausible\":false"), std::string::npos) << diverging.output;
  EXPECT_NE(diverging.output.find("not those of the model on uniformly random tokens: iteration 2's loss"),
            std::string::npos)
      << diverging.output;
  // The encoder classifier: its losses are a 2-label classifier's, its FLOPs its architecture's
  // (perf/flops.h: 3 B (s (l (24 h^2 + 4 s h) + 2 J h^2) + 4 h^2 + 2 h L), J = 2 intermediate layers).
  const Result encoder = run_kiln("bench train --device cpu --model encoder-classifier --num-layers 1 --hidden-size 16 "
                                  "--num-attention-heads 2 --seq-length 8 --micro-batch-size 2 --vocab-size 64 "
                                  "--warmup-iters 1 --timed-iters 2 --json");
  ASSERT_EQ(encoder.exit_code, 0) << encoder.output;
  const auto encoder_json = nlohmann::json::parse(encoder.output);
  EXPECT_EQ(encoder_json["model_kind"], "encoder-classifier");
  EXPECT_TRUE(encoder_json["loss_plausible"].get<bool>());
  const double encoder_ms = encoder_json["median_ms_per_iteration"].get<double>();
  EXPECT_NEAR(encoder_json["samples_per_second"].get<double>(), 2.0 / (encoder_ms * 1e-3), 1e-6);
  const double h = 16, seq = 8;
  const double encoder_flops = 3 * 2 * (seq * (24 * h * h + 4 * seq * h + 2 * 2 * h * h) + 4 * h * h + 2 * h * 2);
  EXPECT_NEAR(encoder_json["model_tflops"].get<double>() * encoder_ms * 1e9, encoder_flops, 1e-6 * encoder_flops);
  const Result bad_gpu = run_kiln("bench train --device cpu --gpu h800 --timed-iters 1");
  EXPECT_EQ(bad_gpu.exit_code, 1);
  EXPECT_NE(bad_gpu.output.find("--gpu 'h800' is not a datasheet"), std::string::npos) << bad_gpu.output;

  const Result attention = run_kiln("bench attention --device cpu --dtype bf16 --batch 2 --seq-length 16 "
                                    "--num-attention-heads 2 --head-size 8 --iters 2 --json");
  ASSERT_EQ(attention.exit_code, 0) << attention.output;
  const auto attention_json = nlohmann::json::parse(attention.output);
  // FlashAttention's count: 4 B T^2 C, halved for the causal mask; backward 2.5 times that.
  EXPECT_NEAR(attention_json["forward_tflops"].get<double>() * attention_json["forward_ms"].get<double>() * 1e9,
              4.0 * 2 * 16 * 16 * 16 / 2, 1e-6);
  EXPECT_NEAR(attention_json["backward_tflops"].get<double>() * attention_json["backward_ms"].get<double>() * 1e9,
              2.5 * 4.0 * 2 * 16 * 16 * 16 / 2, 1e-6);
  const Result bad_mask = run_kiln("bench attention --device cpu --mask diagonal");
  EXPECT_EQ(bad_mask.exit_code, 1);
  EXPECT_NE(bad_mask.output.find("--mask 'diagonal'"), std::string::npos) << bad_mask.output;

  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 5000, 500);
  const Result loader = run_kiln("bench loader --data-path " + dir.path() +
                                 " --seq-length 16 --micro-batch-size 4 --batches 20 --workers 0,2 --cache 0,40 --json");
  ASSERT_EQ(loader.exit_code, 0) << loader.output;
  int rows = 0;
  std::istringstream lines(loader.output);
  for (std::string line; std::getline(lines, line);) {
    const auto row = nlohmann::json::parse(line);
    EXPECT_GT(row["pass1_samples_per_second"].get<double>(), 0.0);
    ++rows;
  }
  EXPECT_EQ(rows, 4);  // 2 worker counts x 2 cache sizes

  // A classification CSV folder: every row decoded per pass, for each worker count.
  ASSERT_EQ(run_kiln("data synth -o " + dir / "cls" + " --files 3 --seq-length 8").exit_code, 0);
  const Result csv = run_kiln("bench loader --data-path " + dir / "cls" + " --workers 0,2 --json");
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  std::istringstream csv_lines(csv.output);
  int csv_rows = 0;
  for (std::string line; std::getline(csv_lines, line); ++csv_rows) {
    const auto row = nlohmann::json::parse(line);
    EXPECT_EQ(row["format"], "csv");
    EXPECT_GT(row["pass2_samples_per_second"].get<double>(), 0.0);
  }
  EXPECT_EQ(csv_rows, 2);

  // Raw text for a classifier: through the loader, each sample tokenized by its workers.
  {
    std::ofstream text(dir / "mail.jsonl");
    for (int i = 0; i < 12; ++i) text << "{\"text\": \"message number " << i << "\", \"label\": " << i % 2 << "}\n";
  }
  const Result text = run_kiln("bench loader --data-path " + dir / "mail.jsonl" +
                               " --seq-length 8 --micro-batch-size 4 --batches 5 --workers 0,2 --json");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  std::istringstream text_lines(text.output);
  int text_rows = 0;
  for (std::string line; std::getline(text_lines, line); ++text_rows)
    EXPECT_GT(nlohmann::json::parse(line)["pass1_samples_per_second"].get<double>(), 0.0) << line;
  EXPECT_EQ(text_rows, 2);
  const Result text_model = run_kiln("bench loader --data-path " + dir / "mail.jsonl" + " --model-iters 2");
  EXPECT_EQ(text_model.exit_code, 1);
  EXPECT_NE(text_model.output.find("does not read classification data"), std::string::npos) << text_model.output;
  const Result no_s3 = run_kiln("bench loader --data-path " + dir.path() + " --storage s3");
  EXPECT_EQ(no_s3.exit_code, 1);
  EXPECT_NE(no_s3.output.find("--storage s3 needs --s3-path"), std::string::npos) << no_s3.output;
}

TEST(Cli, EstimateGpt3) {
  const Result result = run_kiln(
      "estimate --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --vocab-size 51200 "
      "--global-batch-size 1536 --gpus 1536 --gpu a100-80gb --tflops-per-gpu 140 --tokens 300e9 --zero-stage 3 "
      "--recompute-granularity full --recompute-method uniform --json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("\"parameters_exact\":174615846912"), std::string::npos) << result.output;
  // The memory rows need no speed input; the full report asks for one.
  const std::string gpt2 = "estimate --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 "
                           "--vocab-size 50257 --global-batch-size 64 --micro-batch-size 64 --precision bf16";
  const Result memory = run_kiln(gpt2 + " memory");
  ASSERT_EQ(memory.exit_code, 0) << memory.output;
  EXPECT_NE(memory.output.find("gradients 0.46 GiB"), std::string::npos) << memory.output;  // fp32
  EXPECT_EQ(memory.output.find("time per iteration"), std::string::npos) << memory.output;
  // The attention backward adding dQ atomically keeps fp32 sums of dQ in the op scratch (64 x 1024
  // x 768 floats: 0.19 GiB instead of the LayerNorm backward's 0.01).
  EXPECT_NE(memory.output.find("op scratch 0.01 GiB"), std::string::npos) << memory.output;
  const Result atomic = run_kiln(gpt2 + " --no-deterministic-attention memory");
  ASSERT_EQ(atomic.exit_code, 0) << atomic.output;
  EXPECT_NE(atomic.output.find("op scratch 0.19 GiB"), std::string::npos) << atomic.output;
  // fp8 products: the largest product's casts and bias partial sums (0.40 GiB, mlp.c_proj's backward
  // with its 16-bit input gradient to cast for c_fc)
  // outgrow attention's scratch; the products' kept input codes take less than the 16-bit inputs
  // they replace (18.81 GiB of activations in bf16), and the residual gradient's codes in both
  // layouts take 0.09 GiB more.
  const Result fp8 = run_kiln(gpt2 + " --fp8-format hybrid memory");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  EXPECT_NE(fp8.output.find("bf16 + fp8 hybrid"), std::string::npos) << fp8.output;
  EXPECT_NE(fp8.output.find("activations 16.32 GiB + op scratch 0.40 GiB + fp8 scaling 0.00 GiB"), std::string::npos)
      << fp8.output;
  // The classifier and loss on 16384 positions at a time instead of 4096: 12288 rows more of bf16
  // logits (their gradient takes their place), and with the classifier in fp8 of the gradient's
  // codes in both layouts.
  const auto activations = [&](const std::string& flags) {
    const Result r = run_kiln(gpt2 + flags + " memory --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto json = nlohmann::json::parse(r.output);
    return json["memory_bytes"]["activations"].get<double>();
  };
  const double rows = 16384 - 4096, Vp = 50304;
  EXPECT_EQ(activations(" --loss-chunk-rows 16384") - activations(""), rows * Vp * 2);
  const std::string fp8_classifier = " --fp8-format hybrid --fp8-classifier";
  EXPECT_EQ(activations(fp8_classifier + " --loss-chunk-rows 16384") - activations(fp8_classifier), rows * Vp * 4);
  const Result odd_rows = run_kiln(gpt2 + fp8_classifier + " --loss-chunk-rows 100 memory");
  EXPECT_EQ(odd_rows.exit_code, 1);
  EXPECT_NE(odd_rows.output.find("--loss-chunk-rows must be >= 1 (a multiple of 16 with --fp8-classifier), got 100"),
            std::string::npos)
      << odd_rows.output;
  const Result no_speed = run_kiln(gpt2);
  EXPECT_EQ(no_speed.exit_code, 1);
  EXPECT_NE(no_speed.output.find("or ask for the memory rows alone"), std::string::npos) << no_speed.output;
  // The roofline op by op: the largest op of GPT-2 124M at micro-batch 64 is the classifier's backward.
  const Result ops = run_kiln(gpt2 + " ops");
  ASSERT_EQ(ops.exit_code, 0) << ops.output;
  EXPECT_NE(ops.output.find("roofline              63.76 ms per iteration"), std::string::npos) << ops.output;
  EXPECT_NE(ops.output.find("matmul_backward 4096x768x50304                                16"), std::string::npos)
      << ops.output;
  EXPECT_NE(ops.output.find("all ops"), std::string::npos) << ops.output;
  EXPECT_EQ(ops.output.find("memory per GPU"), std::string::npos) << ops.output;
  // What each switch buys: selective recomputation at GPT-2 124M/64 (memory down, one GELU pass more).
  const Result levers = run_kiln(gpt2 + " levers");
  ASSERT_EQ(levers.exit_code, 0) << levers.output;
  EXPECT_NE(levers.output.find("--recompute-granularity selective                              16.77   yes        "
                               "66.65"),
            std::string::npos)
      << levers.output;
  EXPECT_NE(levers.output.find("--micro-batch-size 128                                   does not apply: "
                               "--global-batch-size 64 is not a multiple"),
            std::string::npos)
      << levers.output;
  const auto levers_json = nlohmann::json::parse(run_kiln(gpt2 + " levers --json").output);
  EXPECT_EQ(levers_json["levers"][0]["change"], "(as given)");
  EXPECT_TRUE(levers_json["levers"][0]["fits"].get<bool>());
  const auto ops_json = nlohmann::json::parse(run_kiln(gpt2 + " ops --json").output);
  double sum = 0, bf16_passes = 0;
  for (const auto& op : ops_json["roofline"]["ops"]) {
    sum += op["ms"].get<double>();
    bf16_passes += op["pass_bytes"].get<double>();
  }
  EXPECT_NEAR(sum, ops_json["roofline"]["ms_per_iteration"].get<double>(), 1e-9);
  EXPECT_EQ(bf16_passes, 0.0);  // only fp8 casts run passes of their own (op_work.h)
  // With fp8 products each cast's pass adds to its product's bound. c_fc's, per layer: its weight
  // cast (read 2 bytes, write 1, C x 4C) and its GELU output's (read the pre-activation, 2 bytes,
  // write the codes in both layouts, 2, M x 4C). The attention's c_proj forward and c_attn's
  // backward read the codes the attention wrote, and both projections' backward those the
  // LayerNorm backward after them wrote (all but block 0's ln_1 cast): their only pass is their
  // weight's cast (C x C, C x 3C, C x C and 4C x C).
  const auto fp8_json = nlohmann::json::parse(run_kiln(gpt2 + " --fp8-format hybrid ops --json").output);
  EXPECT_NEAR(fp8_json["roofline"]["ms_per_iteration"].get<double>(), 54.433, 0.001);
  const double M = 64 * 1024, C = 768;
  int found = 0;
  for (const auto& op : fp8_json["roofline"]["ops"]) {
    if (op["op"] == "matmul_forward 65536x768x3072 +bias +gelu codes fp8") {
      ++found;
      EXPECT_EQ(op["pass_bytes"].get<double>(), 12 * (3 * C * 4 * C + 4 * M * 4 * C));
    }
    if (op["op"] == "matmul_backward 65536x768x2304 fp8 dout codes") {
      ++found;
      EXPECT_EQ(op["pass_bytes"].get<double>(), 12 * (3 * C * 3 * C));
    }
    if (op["op"] == "matmul_forward 65536x768x768 +bias +residual fp8") {
      ++found;
      EXPECT_EQ(op["pass_bytes"].get<double>(), 12 * (3 * C * C));
    }
    if (op["op"] == "matmul_backward 65536x768x768 fp8 dout codes") {
      ++found;
      EXPECT_EQ(op["pass_bytes"].get<double>(), 12 * (3 * C * C));
    }
    // The MLP's c_proj casts its input gradient for c_fc (read 2 bytes, write the codes in both
    // layouts, 2, M x 4C) besides its weight; c_fc then casts only its weight.
    if (op["op"] == "matmul_backward 65536x3072x768 +dgelu fp8 dout codes din codes") {
      ++found;
      EXPECT_EQ(op["pass_bytes"].get<double>(), 12 * (3 * 4 * C * C + 4 * M * 4 * C));
    }
    if (op["op"] == "matmul_backward 65536x768x3072 fp8 dout codes") {
      ++found;
      EXPECT_EQ(op["pass_bytes"].get<double>(), 12 * (3 * C * 4 * C));
    }
    if (op["op"] == "layernorm_backward fp8") {
      ++found;
      EXPECT_EQ(op["calls"].get<int>(), 24);
    }
    if (op["op"] == "attention_backward 64x1024, 12 heads of 64 +dbias fp8") ++found;
    if (op["op"] == "attention_forward 64x1024, 12 heads of 64 fp8") ++found;
  }
  EXPECT_EQ(found, 9) << fp8_json.dump();
  const Result bad = run_kiln("estimate --num-layers 2 --hidden-size 64 --num-attention-heads 3 --seq-length 8 "
                              "--vocab-size 10 --global-batch-size 1 --tflops-per-gpu 1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("kiln: error: --num-attention-heads 3 does not divide --hidden-size 64"),
            std::string::npos)
      << bad.output;
}

TEST(Cli, BadInputGivesOneLineErrorAndNonZeroExit) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 1000, 200);
  const std::string data = " --data-path " + dir.path() + " ";
  const auto expect_error = [](const Result& result, const std::string& fragment) {
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("kiln: error: "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(fragment), std::string::npos) << result.output;
  };
  std::ofstream(dir / "unknown.yaml") << "num_layers: 2\nhidden: 64\n";
  expect_error(run_kiln("train --config " + (dir / "unknown.yaml") + data), "unknown.yaml:2: unknown config key 'hidden'");
  std::ofstream(dir / "broken.yaml") << "num_layers: [2\n";
  expect_error(run_kiln("train --config " + (dir / "broken.yaml") + data), "broken.yaml:");
  expect_error(run_kiln("train --hidden-size abc" + data), "--hidden-size: 'hidden_size' expects an integer");
  expect_error(run_kiln("train --micro-batch-size 3 --global-batch-size 10" + data), "'global_batch_size'");
  expect_error(run_kiln("train --data-path " + (dir / "nowhere") + " --vocab-size 29"), "is not a folder");
  expect_error(run_kiln("train --bf16 --fp16" + data + tiny_model_flags()), "'fp16' and 'bf16' are both set");

  // A shard whose header disagrees with its size.
  TempDir cut;
  testing::write_toy_dataset(cut.path(), 29, 1000, 200);
  std::filesystem::resize_file(cut / "train_000000.bin", 1024 + 100);
  expect_error(run_kiln("train --data-path " + cut.path() + " " + tiny_model_flags()),
               "train_000000.bin: header at offset 8 declares 1000 tokens");

  // A checkpoint that is not there, and a corrupt one.
  expect_error(run_kiln("generate --load " + (dir / "no-ckpt")), "does not exist");
  std::filesystem::create_directories(dir / "bad-ckpt");
  std::ofstream(dir / "bad-ckpt/model.safetensors") << "garbage!!";
  std::ofstream(dir / "bad-ckpt/trainer_state.json") << "{";
  expect_error(run_kiln("generate --load " + (dir / "bad-ckpt")), "trainer_state.json: corrupt trainer state");
}


// The seed course's Megatron-LM command line (pretrain_gpt.py's arguments) runs unchanged but for
// tiny sizes, 2 iterations and random tokens instead of --data-path.
TEST(Cli, MegatronCourseCommandLineRuns) {
  TempDir dir;
  // GPT-2's encoder.json and vocab.bpe formats, a toy vocabulary of 6 tokens.
  std::ofstream(dir / "gpt2-vocab.json") << R"({"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "\u0120": 5})";
  std::ofstream(dir / "gpt2-merges.txt") << "#version: 0.2\na b\nab c\n";
  const std::string course =
      "train --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 "
      "--micro-batch-size 2 --global-batch-size 4 --lr 0.00015 --train-iters 2 --lr-decay-iters 320000 "
      "--lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 1e-2 --lr-warmup-fraction .01 --clip-grad 1.0 --fp16 "
      "--mock-data --vocab-size 64 --vocab-file " + (dir / "gpt2-vocab.json") + " --merge-file " +
      (dir / "gpt2-merges.txt") +
      " --split 949,50,1 --log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10 "
      "--distributed-backend nccl --save " + (dir / "CKPT") + " --load " + (dir / "CKPT") +
      " --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --optimizer adam --data-impl mmap "
      "--exit-duration-in-mins 1190 --DDP-impl local --use-distributed-optimizer --timing-log-level 2 "
      "--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion --no-gradient-accumulation-fusion "
      "--adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --hidden-dropout 0.1 --attention-dropout 0.1 --num-workers 2 "
      "--tensorboard-dir " +
      (dir / "TB") + " --log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard "
      "--log-memory-to-tensorboard --log-world-size-to-tensorboard";
  const Result printed = run_kiln(course + " --print-config");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  for (const std::string& line : std::vector<std::string>{
           "optimizer: adam", "tensor_model_parallel_size: 1", "data_impl: mmap", "ddp_impl: local",
        "timing_log_level: 2", "masked_softmax_fusion: false", "gradient_accumulation_fusion: false",
        "hidden_dropout: 0.1", "attention_dropout: 0.1",
        "vocab_file: " + (dir / "gpt2-vocab.json"), "merge_file: " + (dir / "gpt2-merges.txt")})
    EXPECT_NE(printed.output.find(line + "\n"), std::string::npos) << line << "\n" << printed.output;
  const Result trained = run_kiln(course);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("validation loss at"), std::string::npos) << trained.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "CKPT/latest_checkpointed_iteration.txt")) << trained.output;
  EXPECT_FALSE(std::filesystem::is_empty(dir / "TB")) << trained.output;  // the event file
}

TEST(Cli, UnknownFlagsAreNamedOneLineEachWithTheClosest) {
  const Result result = run_kiln("train --hiden-size 3 --lrr 1 --swiglu --mock-data --vocab-size 64");
  EXPECT_EQ(result.exit_code, 109) << result.output;  // CLI11's ExtrasError, as main() exits on parse errors
  EXPECT_EQ(result.output,
            "kiln: error: unknown flag '--hiden-size' (did you mean --hidden-size?)\n"
            "kiln: error: unknown flag '--lrr' (did you mean --lr?)\n"
            "kiln: error: unknown flag '--swiglu'\n"
            "kiln: the flags `kiln train --help` lists are the ones it knows\n"
            "Run with --help for more information.\n");
  // kiln bench train shares the flags, and the refusal.
  const Result bench = run_kiln("bench train --device cpu --num-layer 1 --timed-iters 1");
  EXPECT_EQ(bench.exit_code, 109) << bench.output;
  EXPECT_EQ(bench.output.rfind("kiln: error: unknown flag '--num-layer' (did you mean --num-layers?)\n"
                               "kiln: the flags `kiln bench train --help` lists are the ones it knows\n",
                               0),
            0u)
      << bench.output;
}

TEST(Cli, TensorParallelismNamesTheKey) {
  const Result result = run_kiln("train --tensor-model-parallel-size 2 --mock-data --vocab-size 64 " + tiny_model_flags());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("kiln: error: config key 'tensor_model_parallel_size' is 2: tensor parallelism is not "
                               "supported yet (kiln is data-parallel only)"),
            std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace kiln
