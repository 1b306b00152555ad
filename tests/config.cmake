# Configuration: typed keys, checks across keys, overrides, messages naming file/line/key.
gtrain_add_c_test(test_config SOURCES ${GTRAIN_TEST_DIR}/test_config.c ARGS ${PROJECT_SOURCE_DIR})

# The real binary on bad configurations (tests/configs/bad_*.ini): exit code 2 and a message that
# names the file, the line and the key. EXPECT is a regex; `.` stands in for [ and ] to keep the
# patterns free of escapes.
function(gtrain_cli_bad name config expect)
  cmake_parse_arguments(C "" "OVERRIDE" "" ${ARGN})
  set(extra)
  if(C_OVERRIDE)
    set(extra -DOVERRIDE=${C_OVERRIDE})
  endif()
  add_test(NAME cli_bad_${name}
           COMMAND ${CMAKE_COMMAND} -DGTRAIN=$<TARGET_FILE:gtrain> -DCONFIG=configs/${config}
                   ${extra} "-DEXPECT=${expect}" -P ${GTRAIN_TEST_DIR}/scripts/check_exit2.cmake
           WORKING_DIRECTORY ${GTRAIN_TEST_DIR})
  set_tests_properties(cli_bad_${name} PROPERTIES LABELS unit)
endfunction()

gtrain_cli_bad(unknown_key bad_unknown_key.ini "configs/bad_unknown_key.ini:7: unknown key .train. stepz")
gtrain_cli_bad(unknown_section bad_unknown_section.ini "configs/bad_unknown_section.ini:5: unknown section .trian.")
gtrain_cli_bad(wrong_type bad_wrong_type.ini "configs/bad_wrong_type.ini:6: .train. lr: 'fast' is not a number")
gtrain_cli_bad(out_of_range bad_out_of_range.ini "configs/bad_out_of_range.ini:5: .model. dropout: 1.5 is out of range")
gtrain_cli_bad(dim_heads bad_dim_heads.ini "configs/bad_dim_heads.ini:5: .model. n_heads: n_heads 6 does not divide dim 64")
gtrain_cli_bad(kv_heads bad_kv_heads.ini "configs/bad_kv_heads.ini:6: .model. n_kv_heads: n_kv_heads 3 does not divide n_heads 4")
gtrain_cli_bad(seq_len bad_seq_len.ini "configs/bad_seq_len.ini:7: .train. seq_len: seq_len 512 is longer than max_seq_len 256")
gtrain_cli_bad(recompute bad_recompute.ini "configs/bad_recompute.ini:7: .memory. recompute: .*1\\.\\.4")
gtrain_cli_bad(auto_budget bad_auto_budget.ini "configs/bad_auto_budget.ini:5: .memory. recompute: recompute auto needs memory.budget")
gtrain_cli_bad(missing_data bad_missing_data.ini "configs/bad_missing_data.ini:5: .data. train: cannot read 'configs/no-such-file.bin'")
gtrain_cli_bad(override good_for_overrides.ini "command line: train.lr=abc: 'abc' is not a number" OVERRIDE train.lr=abc)
gtrain_cli_bad(malformed_override good_for_overrides.ini "command line: train.=3: not an override" OVERRIDE train.=3)
gtrain_cli_bad(missing_config no-such-config.ini "configs/no-such-config.ini: cannot open the config file")
